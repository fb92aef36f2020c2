// counters_impl.h -- how the command-buffer code bumps the public counters.
#pragma once
#include "msl_emu/counters.h"

namespace fake_objc {
void count_commit();
void count_wait();
void count_dispatch(bool indirect);
void count_blit();
}  // namespace fake_objc
