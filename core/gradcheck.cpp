// gradcheck for float ops recorded on a Tape.
#include "core/gradcheck.h"

#include "core/ops.h"
#include "core/random.h"

namespace tapegrad {

GradcheckReport gradcheck(const std::string& op, const std::function<Var(const std::vector<Var>&)>& f,
                          std::vector<Tensor> inputs, double eps, double atol, double rtol) {
  std::vector<Var> leaves;
  for (auto& t : inputs) leaves.emplace_back(t, true);
  Tensor R;
  {
    NoGradScope no_grad;
    Rng rng(1234);
    R = Tensor(f(leaves).shape());
    rng.fill_normal(R, 1.0f);
  }
  {
    Tape tape;
    Var y = f(leaves);
    Var loss = sum(mul(y, Var(R)));
    tape.backward(loss);
  }
  GradcheckReport report;
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    Tensor& value = leaves[k].mutable_value();
    std::vector<float> x(value.data(), value.data() + value.size());
    std::vector<float> analytic = leaves[k].has_grad()
                                      ? std::vector<float>(leaves[k].grad().data(), leaves[k].grad().data() + x.size())
                                      : std::vector<float>(x.size(), 0.0f);
    std::vector<float> r(R.data(), R.data() + R.size());
    auto forward = [&] {
      std::copy(x.begin(), x.end(), value.data());
      NoGradScope no_grad;
      Var y = f(leaves);
      return std::vector<float>(y.value().data(), y.value().data() + y.value().size());
    };
    GradcheckReport part =
        check_kernel_gradient<float>(fmt::format("{} input {} {}", op, k, to_string(value.shape())), x, forward, r,
                                     analytic, eps, atol, rtol);
    std::copy(x.begin(), x.end(), value.data());
    report.max_abs_error = std::max(report.max_abs_error, part.max_abs_error);
    if (report.ok && !part.ok) report = {false, report.max_abs_error, part.message};
  }
  return report;
}

}  // namespace tapegrad
