// router_avx2.cpp — the router's dot products on ymm registers (kernels/router_dots.h); the same bits as portable.
#define MOE_ISA avx2  // kernels/isa.h: this file's ISA region
#include "kernels/router_dots.h"
