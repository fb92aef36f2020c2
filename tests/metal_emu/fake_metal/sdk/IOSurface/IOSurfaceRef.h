// Stand-in for <IOSurface/IOSurfaceRef.h>: metal-cpp names the type only.
#pragma once
typedef struct __IOSurface* IOSurfaceRef;
