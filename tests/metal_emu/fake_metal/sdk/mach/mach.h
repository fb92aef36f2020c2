// Stand-in for <mach/mach.h>: the types metal-cpp names.
#pragma once
typedef int kern_return_t;
typedef unsigned int task_id_token_t;
typedef unsigned int mach_port_t;
