// router_portable.cpp — the router's dot products for the baseline target (kernels/router_dots.h).
#define MOE_ISA portable  // kernels/isa.h: this file's ISA region
#include "kernels/router_dots.h"
