// Built against an installed dloss: CLIP through the JIT on one process,
// checked (loss and gradients) against ATen's autograd. Prints PASS.
#include "frontend/Jit.h"
#include "frontend/Losses.h"
#include "runtime/comm/Engines.h"
#include "runtime/support/Error.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>

namespace {

/// OpenCLIP's ClipLoss on one process, eager ATen.
at::Tensor clipReference(const at::Tensor &image, const at::Tensor &text,
                         const at::Tensor &scale) {
  at::Tensor labels = at::arange(image.size(0), at::kLong);
  at::Tensor logits = scale * image.matmul(text.t());
  return (at::cross_entropy_loss(logits, labels) +
          at::cross_entropy_loss(logits.t(), labels)) /
         2;
}

at::Tensor normalizedRows(int64_t rows, int64_t dim) {
  at::Tensor x = at::randn({rows, dim});
  return x / x.norm(2, {1}, /*keepdim=*/true);
}

bool matches(const char *what, const at::Tensor &got, const at::Tensor &want) {
  double error = (got - want).abs().max().item<double>() /
                 std::max(want.abs().max().item<double>(), 1e-30);
  std::printf("%s: relative error %.3g\n", what, error);
  return error < 1e-5;
}

} // namespace

int main() {
  try {
    at::manual_seed(0);
    dloss::jit::Options options;
    options.communicator = dloss::makeSingleProcessCommunicator();
    dloss::CompiledLoss loss =
        dloss::jit::compile(dloss::losses::clip({4}), options);

    at::Tensor image = normalizedRows(8, 4).requires_grad_();
    at::Tensor text = normalizedRows(8, 4).requires_grad_();
    at::Tensor scale = at::scalar_tensor(10.0, at::kFloat).requires_grad_();
    at::Tensor value = loss({image, text, scale});
    value.backward();

    at::Tensor i2 = image.detach().clone().requires_grad_();
    at::Tensor t2 = text.detach().clone().requires_grad_();
    at::Tensor s2 = scale.detach().clone().requires_grad_();
    at::Tensor want = clipReference(i2, t2, s2);
    want.backward();

    bool ok = matches("loss", value.detach(), want.detach());
    ok &= matches("d image", image.grad(), i2.grad());
    ok &= matches("d text", text.grad(), t2.grad());
    ok &= matches("d scale", scale.grad(), s2.grad());
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
