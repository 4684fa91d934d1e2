// A build without oneDNN: no oneDNN matmul (onednn_matmul.h).
#include "kernels/cpu/onednn_matmul.h"

#include "core/check.h"
namespace ddp::cpu {
bool onednn_built() { return false; }
std::string onednn_native_bf16_isa() { return ""; }
struct OnednnMatmul::Impl {};
OnednnMatmul::OnednnMatmul() = default;
OnednnMatmul::~OnednnMatmul() = default;
void OnednnMatmul::run(const MatmulShape&, const void*, const void*, const float*, void*) {
  DDP_THROW("no oneDNN");
}
}  // namespace ddp::cpu
