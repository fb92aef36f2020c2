// install.h -- each file of the fake Metal framework installs its classes' methods; the
// runtime calls these once, before the first message is sent.
#pragma once

namespace fake_objc {
void install_root();        // foundation.cpp: NSObject, NSAutoreleasePool
void install_foundation();  // foundation.cpp: NSString, NSError, NSArray, NSDictionary, NSNumber, NSURL
void install_device();      // device.cpp: MTLDevice
void install_library();     // library.cpp: MTLCompileOptions, MTLLibrary, MTLFunction, MTLComputePipelineState
void install_buffer();      // buffer.cpp: MTLBuffer
void install_commands();    // commands.cpp: MTLCommandQueue, MTLCommandBuffer, the encoders
}  // namespace fake_objc
