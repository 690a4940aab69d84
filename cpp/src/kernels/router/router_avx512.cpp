// router_avx512.cpp — the router's dot products on zmm registers (kernels/router_dots.h); the same bits as portable.
#define MOE_ISA avx512  // kernels/isa.h: this file's ISA region
#include "kernels/router_dots.h"
