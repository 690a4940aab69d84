// silu_avx512.cpp — SiLU(g) * u on zmm registers (kernels/silu_mul.h); the same bits as portable.
#define MOE_ISA avx512  // kernels/isa.h: this file's ISA region
#include "kernels/silu_mul.h"
