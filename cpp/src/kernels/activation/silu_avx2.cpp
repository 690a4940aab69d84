// silu_avx2.cpp — SiLU(g) * u on ymm registers (kernels/silu_mul.h); the same bits as portable.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/silu_mul.h"
