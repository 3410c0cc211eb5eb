// dloss-npy-roundtrip: loads a .npy file with dloss::npy::load and saves it
// with dloss::npy::save (for npy_numpy_check.py).
#include "runtime/io/Npy.h"
#include "runtime/support/Error.h"

#include <ATen/ATen.h>

#include <iostream>

int main(int argc, char **argv) {
  if (argc != 3) {
    std::cerr << "usage: dloss-npy-roundtrip IN.npy OUT.npy\n";
    return 2;
  }
  try {
    dloss::npy::save(argv[2], dloss::npy::load(argv[1]));
  } catch (const dloss::Error &e) {
    // Exit 1 with the message: the check script tests the rejections too.
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
