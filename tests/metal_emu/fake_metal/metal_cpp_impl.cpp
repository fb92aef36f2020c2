// metal_cpp_impl.cpp -- the one translation unit that instantiates metal-cpp's selector and
// class tables (the *_PRIVATE_IMPLEMENTATION rule of metal-cpp). Its static initialisers call
// sel_registerName / objc_lookUpClass of the fake runtime.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#define CA_PRIVATE_IMPLEMENTATION
#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>
#include <QuartzCore/QuartzCore.hpp>
