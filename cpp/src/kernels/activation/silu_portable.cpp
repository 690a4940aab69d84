// silu_portable.cpp — SiLU(g) * u on the baseline target (kernels/silu_mul.h).
#define MOE_ISA portable  // kernels/isa.h: this file's ISA region
#include "kernels/silu_mul.h"
