// Weights on disk as safetensors (F32 only): the format PyTorch and Hugging Face users load
// directly. Writes are atomic (temp file, fsync, rename); reads validate the file as strictly as
// the reference implementation, so a corrupt or foreign file fails with a message naming it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddp {

/// The most tensors one file may hold: far above any MLP's (two per layer, and an optimizer
/// state or two beside them in a checkpoint), low enough that a header of millions of tiny
/// entries is refused by name before any is built.
constexpr uint64_t kMaxSafetensorsTensors = 65536;

/// One named float32 tensor, row-major: a Linear weight is {out, in}, a bias {out}.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // product(shape) values
};

/// Writes `tensors` (in the given order; at most kMaxSafetensorsTensors, names unique and valid
/// UTF-8, data.size() == product(shape)) and `metadata` as an F32 safetensors file that
/// atomically replaces `path`; a metadata value that is not valid UTF-8 is stored with U+FFFD for
/// each invalid byte. Throws ddp::Error naming the tensor or the path and the OS error, and then
/// leaves any old file at `path` intact.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A tensor to write under `name`, by reference (a checkpoint writes its weights and optimizer
/// state without copying them): `tensor` must outlive the call.
struct TensorView {
  std::string name;
  const NamedTensor* tensor;
};

/// As save_safetensors, for tensors written under names of their own.
void save_safetensors_views(const std::string& path, const std::vector<TensorView>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads and fully validates an F32 safetensors file (in time linear in its size, at most
/// kMaxSafetensorsTensors tensors); returns its tensors in file (data offset) order, or throws
/// ddp::Error naming the file and, where it applies, the tensor.
std::vector<NamedTensor> load_safetensors(const std::string& path);

/// As above, and stores the header's "__metadata__" map (empty if absent) into *metadata.
std::vector<NamedTensor> load_safetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata);

/// The header's "__metadata__" map alone (empty if absent), without reading the tensors; the
/// header is validated as load_safetensors validates it.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

/// Throws ddp::Error "<what>: tensor 'layers.0.weight' holds nan at index 17 (row 0, column 17)"
/// for the first NaN or infinity of `tensors`, in their order (row and column for 2-D tensors):
/// weights that would make every output nan. `what` names the file ("model 'm.safetensors'").
void require_finite(const std::vector<NamedTensor>& tensors, const std::string& what);

}  // namespace ddp
