// oneDNN's matmul primitive behind OnednnMatmul (onednn_matmul.h): one primitive per MatmulShape,
// transposes as strides over the caller's storage, bias, ReLU and accumulation fused into the
// primitive. Debian's oneDNN threads with OpenMP; every call here runs it on one thread, since
// each rank owns one core. Without DDP_WITH_ONEDNN the file compiles to "not built".
#include "kernels/cpu/onednn_matmul.h"

#include "core/check.h"

#if defined(DDP_WITH_ONEDNN)

#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace ddp::cpu {

namespace {

const char* type_name(MatType t) { return t == MatType::F32 ? "f32" : "bf16"; }

/// "[m,k]x[k,n] bf16->f32", plus the flags that are set: how errors name a shape.
std::string describe(const MatmulShape& s) {
  std::ostringstream os;
  os << "[" << s.m << "," << s.k << "]x[" << s.k << "," << s.n << "] " << type_name(s.a);
  if (s.b != s.a) os << "/" << type_name(s.b);
  os << "->" << type_name(s.c);
  std::vector<const char*> flags;
  if (s.trans_a) flags.push_back("trans_a");
  if (s.trans_b) flags.push_back("trans_b");
  if (s.bias) flags.push_back("bias");
  if (s.relu) flags.push_back("relu");
  if (s.accumulate) flags.push_back("accumulate");
  for (size_t i = 0; i < flags.size(); ++i) os << (i ? ", " : " (") << flags[i];
  if (!flags.empty()) os << ")";
  return os.str();
}

/// Every field of MatmulShape, the eight choices packed as bits: two shapes with the same key
/// build the same primitive.
using ShapeKey = std::tuple<int64_t, int64_t, int64_t, unsigned>;

ShapeKey key_of(const MatmulShape& s) {
  const bool choices[] = {
      s.trans_a, s.trans_b, s.a == MatType::BF16, s.b == MatType::BF16, s.c == MatType::BF16,
      s.bias,    s.relu,    s.accumulate};
  unsigned bits = 0;
  for (bool c : choices) bits = bits << 1 | static_cast<unsigned>(c);
  return {s.m, s.n, s.k, bits};
}

dnnl::memory::data_type dnnl_type(MatType t) {
  return t == MatType::F32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

/// A rows x cols operand over row-major storage, stored as written or transposed ([cols, rows]
/// in memory): the transpose is only the strides, so oneDNN reads the caller's buffer in place.
dnnl::memory::desc operand_desc(int64_t rows, int64_t cols, bool transposed, MatType t) {
  const dnnl::memory::dims strides =
      transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1};
  return dnnl::memory::desc({rows, cols}, dnnl_type(t), strides);
}

/// OpenMP's thread count for the calling thread set to one for the guard's lifetime, then
/// restored: oneDNN sizes its parallel regions (and picks blockings at creation) by
/// omp_get_max_threads(), and a rank must not spread over the cores of the other ranks.
class OneThread {
 public:
  OneThread() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(previous_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int previous_;
};

/// A built primitive and its memory objects, whose data handles each call repoints.
struct Prepared {
  dnnl::matmul matmul;
  dnnl::memory a, b, bias, c;
};

void check_shape(const MatmulShape& s, const float* bias) {
  DDP_CHECK(s.m > 0 && s.n > 0 && s.k > 0,
            "oneDNN matmul " << describe(s) << ": dimensions must be positive");
  DDP_CHECK(!s.accumulate || (s.c == MatType::F32 && !s.bias && !s.relu),
            "oneDNN matmul " << describe(s) << ": accumulate needs an f32 result, no bias or relu");
  DDP_CHECK((bias != nullptr) == s.bias, "oneDNN matmul " << describe(s) << ": bias pointer given "
                                                          << (bias != nullptr) << " but shape.bias "
                                                          << s.bias);
}

dnnl::primitive_attr make_attr(const MatmulShape& s) {
  dnnl::post_ops ops;
  // The sum post-op reads C before the store: C = C + A·B (scale 1).
  if (s.accumulate) ops.append_sum(1.0f);
  if (s.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  return attr;
}

Prepared prepare(const MatmulShape& s, const dnnl::engine& engine) {
  const auto a_md = operand_desc(s.m, s.k, s.trans_a, s.a);
  const auto b_md = operand_desc(s.k, s.n, s.trans_b, s.b);
  const auto c_md = operand_desc(s.m, s.n, false, s.c);
  const auto bias_md = s.bias ? operand_desc(1, s.n, false, MatType::F32) : dnnl::memory::desc();
  const dnnl::matmul::desc desc(a_md, b_md, bias_md, c_md);
  const dnnl::matmul::primitive_desc pd(desc, make_attr(s), engine);
  // Handles start null: run() points them at the caller's buffers before every execution.
  Prepared p{dnnl::matmul(pd), dnnl::memory(a_md, engine, nullptr),
             dnnl::memory(b_md, engine, nullptr), dnnl::memory(),
             dnnl::memory(c_md, engine, nullptr)};
  if (s.bias) p.bias = dnnl::memory(bias_md, engine, nullptr);
  return p;
}

}  // namespace

bool onednn_built() { return true; }

std::string onednn_native_bf16_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "";
  }
}

struct OnednnMatmul::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<ShapeKey, Prepared> prepared;

  Prepared& find_or_prepare(const MatmulShape& s) {
    const ShapeKey key = key_of(s);
    auto it = prepared.find(key);
    if (it == prepared.end()) it = prepared.emplace(key, prepare(s, engine)).first;
    return it->second;
  }
};

OnednnMatmul::OnednnMatmul() : impl_(std::make_unique<Impl>()) {}
OnednnMatmul::~OnednnMatmul() = default;

void OnednnMatmul::run(const MatmulShape& s, const void* a, const void* b, const float* bias,
                       void* c) {
  check_shape(s, bias);
  try {
    const OneThread one_thread;
    Prepared& p = impl_->find_or_prepare(s);
    // oneDNN's handles are non-const; the primitive only reads a, b and bias.
    p.a.set_data_handle(const_cast<void*>(a));
    p.b.set_data_handle(const_cast<void*>(b));
    p.c.set_data_handle(c);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}};
    if (s.bias) {
      p.bias.set_data_handle(const_cast<float*>(bias));
      args.emplace(DNNL_ARG_BIAS, p.bias);
    }
    p.matmul.execute(impl_->stream, args);
    impl_->stream.wait();
  } catch (const dnnl::error& e) {
    DDP_THROW("oneDNN matmul " << describe(s) << ": " << e.what());
  }
}

}  // namespace ddp::cpu

#else  // no oneDNN in this build

namespace ddp::cpu {

bool onednn_built() { return false; }
std::string onednn_native_bf16_isa() { return ""; }

struct OnednnMatmul::Impl {};

OnednnMatmul::OnednnMatmul() = default;
OnednnMatmul::~OnednnMatmul() = default;

void OnednnMatmul::run(const MatmulShape&, const void*, const void*, const float*, void*) {
  DDP_THROW("this build has no oneDNN");
}

}  // namespace ddp::cpu

#endif
