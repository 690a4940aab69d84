// shared.h — an inline helper in a header that several files include, as amx_scratch.h's tile_config was:
// the linker keeps one copy of it for all of them.
#pragma once

struct Config {
  float v[16];
};

inline Config make_config(float x) {
  Config c;
  for (int i = 0; i < 16; ++i) c.v[i] = x * float(i);
  return c;
}
