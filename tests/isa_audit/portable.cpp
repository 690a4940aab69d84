// portable.cpp — portable code that calls the shared helper.
#include <vector>

#include "shared.h"

float portable_sum(float x) {
  std::vector<float> v(4, x);
  v.resize(40);
  return make_config(x).v[3] + v[1];
}
