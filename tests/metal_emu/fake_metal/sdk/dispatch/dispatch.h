// Stand-in for <dispatch/dispatch.h>: metal-cpp names these types only.
#pragma once
typedef struct dispatch_queue_s* dispatch_queue_t;
typedef struct dispatch_data_s* dispatch_data_t;
