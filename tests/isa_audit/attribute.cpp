// attribute.cpp — a shared inline helper given an ISA by a target attribute outside any ISA region.
__attribute__((target("avx2,fma"))) inline void axpy8(float* y, const float* x, float a) {
  for (int i = 0; i < 8; ++i) y[i] += a * x[i];
}

__attribute__((target("avx2,fma"))) void caller(float* y, const float* x) { axpy8(y, x, 2.f); }
