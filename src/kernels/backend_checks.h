// Argument checks shared by every backend: device, shape and aliasing of the Tensor views a
// kernel is given. A wrong view reported at the call beats a crash (or a silently wrong result)
// far from the mistake, and both backends word the messages the same way.
#pragma once

#include <string>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace ddp {
namespace checks {

std::string describe(const char* name, const Tensor& t);

/// t lives on `device`, has non-negative extents and data unless empty.
void tensor(const char* op, const char* name, const Tensor& t, Device device);
void same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                const Tensor& b, Device device);
/// For kernels over flat arrays (sgd_step, adam_step): only the element counts must agree.
void same_size(const char* op, const char* a_name, const Tensor& a, const char* b_name,
               const Tensor& b, Device device);
/// Products write their output while reading their inputs: overlap is rejected.
void disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name,
              const Tensor& in);

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    Device device);
void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                           const Tensor& dx, Device device);
void linear_backward_params(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            Device device);

void softmax_xent(const Tensor& logits, const int32_t* labels, const Tensor* dlogits,
                  Device device);
/// Sizes, and the option combinations torch.optim.SGD refuses.
void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
              const SgdOptions& opt, Device device);

/// Sizes: every state array the step touches has the parameters' size.
void adam_step(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
               const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStep& s,
               Device device);

}  // namespace checks
}  // namespace ddp
