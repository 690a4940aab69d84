// flagged.cpp — compiled with -mavx512f, as the kernel files were before kernels/isa.h: its copies of the
// shared helper and of std::vector's growth are AVX-512 code the linker may keep for portable.cpp.
#include <vector>

#include "shared.h"

float flagged_sum(float x) {
  std::vector<float> v(4, x);
  v.resize(40);
  return make_config(x).v[5] + v[2];
}
