// Argument checks shared by the CPU and CUDA backends.
#include "kernels/backend_checks.h"

#include "core/check.h"

namespace ddp {
namespace checks {

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + shape_string(t.rows, t.cols);
}

void tensor(const char* op, const char* name, const Tensor& t, Device device) {
  DDP_CHECK(t.device == device, op << ": " << name << " is a " << device_name(t.device)
                                   << " tensor, the " << device_name(device) << " backend needs "
                                   << device_name(device) << " tensors");
  DDP_CHECK(t.rows >= 0 && t.cols >= 0,
            op << ": " << describe(name, t) << " has a negative extent");
  DDP_CHECK(t.data != nullptr || t.numel() == 0, op << ": " << describe(name, t) << " has no data");
}

void same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                const Tensor& b, Device device) {
  tensor(op, a_name, a, device);
  tensor(op, b_name, b, device);
  DDP_CHECK(a.rows == b.rows && a.cols == b.cols,
            op << ": shapes differ: " << describe(a_name, a) << ", " << describe(b_name, b));
}

void same_size(const char* op, const char* a_name, const Tensor& a, const char* b_name,
               const Tensor& b, Device device) {
  tensor(op, a_name, a, device);
  tensor(op, b_name, b, device);
  DDP_CHECK(a.numel() == b.numel(), op << ": sizes differ: " << describe(a_name, a) << " has "
                                       << a.numel() << " elements, " << describe(b_name, b)
                                       << " has " << b.numel());
}

namespace {
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const float* a_end = a.data + a.numel();
  const float* b_end = b.data + b.numel();
  return a.data < b_end && b.data < a_end;
}
}  // namespace

void disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name,
              const Tensor& in) {
  DDP_CHECK(!overlaps(out, in),
            op << ": output " << out_name << " overlaps input " << in_name << " (not supported)");
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    Device device) {
  const char* op = "linear_forward";
  tensor(op, "x", x, device);
  tensor(op, "w", w, device);
  tensor(op, "bias", bias, device);
  tensor(op, "y", y, device);
  DDP_CHECK(x.cols == w.cols && bias.rows == 1 && bias.cols == w.rows && y.rows == x.rows &&
                y.cols == w.rows,
            op << ": shapes do not match: " << describe("x", x) << ", " << describe("w", w) << ", "
               << describe("bias", bias) << ", " << describe("y", y)
               << " (expected x [b, in], w [out, in], bias [1, out], y [b, out])");
  disjoint(op, "y", y, "x", x);
  disjoint(op, "y", y, "w", w);
  disjoint(op, "y", y, "bias", bias);
}

void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor* relu_output,
                           const Tensor& dx, Device device) {
  const char* op = "linear_backward_input";
  tensor(op, "dy", dy, device);
  tensor(op, "w", w, device);
  tensor(op, "dx", dx, device);
  DDP_CHECK(dy.cols == w.rows && dx.rows == dy.rows && dx.cols == w.cols,
            op << ": shapes do not match: " << describe("dy", dy) << ", " << describe("w", w)
               << ", " << describe("dx", dx) << " (expected dy [b, out], w [out, in], dx [b, in])");
  disjoint(op, "dx", dx, "dy", dy);
  disjoint(op, "dx", dx, "w", w);
  if (relu_output == nullptr) return;
  tensor(op, "relu_output", *relu_output, device);
  DDP_CHECK(relu_output->rows == dx.rows && relu_output->cols == dx.cols,
            op << ": " << describe("relu_output", *relu_output) << " must have the shape of "
               << describe("dx", dx));
  disjoint(op, "dx", dx, "relu_output", *relu_output);
}

void linear_backward_params(const Tensor& dy, const Tensor& x, const Tensor& dw, const Tensor& db,
                            Device device) {
  const char* op = "linear_backward_params";
  tensor(op, "dy", dy, device);
  tensor(op, "x", x, device);
  tensor(op, "dw", dw, device);
  tensor(op, "db", db, device);
  DDP_CHECK(dy.rows == x.rows && dw.rows == dy.cols && dw.cols == x.cols && db.rows == 1 &&
                db.cols == dy.cols,
            op << ": shapes do not match: " << describe("dy", dy) << ", " << describe("x", x)
               << ", " << describe("dw", dw) << ", " << describe("db", db)
               << " (expected dy [b, out], x [b, in], dw [out, in], db [1, out])");
  disjoint(op, "dw", dw, "dy", dy);
  disjoint(op, "dw", dw, "x", x);
  disjoint(op, "db", db, "dy", dy);
  disjoint(op, "db", db, "dw", dw);
}

void softmax_xent(const Tensor& logits, const int32_t* labels, const Tensor* dlogits,
                  Device device) {
  const char* op = "softmax_xent";
  tensor(op, "logits", logits, device);
  DDP_CHECK(logits.cols >= 1, op << ": " << describe("logits", logits) << " has no classes");
  DDP_CHECK(labels != nullptr || logits.rows == 0, op << ": labels is null");
  if (dlogits != nullptr) same_shape(op, "logits", logits, "dlogits", *dlogits, device);
}

void sgd_step(const Tensor& params, const Tensor& grads, const Tensor& momentum_buf,
              const SgdOptions& opt, Device device) {
  const char* op = "sgd_step";
  same_size(op, "params", params, "grads", grads, device);
  if (opt.momentum != 0.0f) same_size(op, "params", params, "momentum_buf", momentum_buf, device);
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0.0f && opt.dampening == 0.0f),
            op << ": nesterov needs momentum > 0 and dampening == 0 (got momentum " << opt.momentum
               << ", dampening " << opt.dampening << ")");
}

void adam_step(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
               const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStep& s,
               Device device) {
  const char* op = "adam_step";
  same_size(op, "params", params, "grads", grads, device);
  same_size(op, "params", params, "exp_avg", exp_avg, device);
  same_size(op, "params", params, "exp_avg_sq", exp_avg_sq, device);
  if (s.amsgrad) same_size(op, "params", params, "max_exp_avg_sq", max_exp_avg_sq, device);
}

}  // namespace checks
}  // namespace ddp
