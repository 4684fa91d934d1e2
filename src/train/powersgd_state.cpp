// PowerSGD's state in and out of checkpoints (powersgd_state.h).
#include "train/powersgd_state.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "comm/agreement.h"
#include "comm/powersgd_communicator.h"
#include "core/check.h"

namespace ddp {

namespace {

// The factored weights in the model's order: index, name, Q's shape [in, r], arena offset.
struct Factored {
  size_t param = 0;
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  size_t numel() const { return static_cast<size_t>(shape[0] * shape[1]); }
};

std::vector<Factored> factored_weights(const Replica& replica, const PowerSgdCommunicator& p) {
  std::vector<Factored> out;
  const std::vector<Parameter*>& params = replica.model().parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t offset = replica.plan().param_offset[i];
    const size_t r = p.factor_rank(offset);
    if (r == 0) continue;
    out.push_back({i, params[i]->name, {params[i]->shape[1], static_cast<int64_t>(r)}, offset});
  }
  return out;
}

// Rank 0: why `stored` cannot continue this run ("" when it can).
std::string unusable(const PowerSgdCheckpoint& stored, int world,
                     const std::vector<Factored>& factored) {
  if (stored.empty()) return "the checkpoint holds none";
  if (static_cast<int>(stored.error.size()) != world) {
    return "the checkpoint holds the error feedback of " + std::to_string(stored.error.size()) +
           " rank(s), this run has " + std::to_string(world);
  }
  for (const NamedTensor& q : stored.q) {
    const auto f = std::find_if(factored.begin(), factored.end(),
                                [&](const Factored& x) { return x.name == q.name; });
    if (f == factored.end()) return "its Q of " + q.name + " is for a weight this run sends whole";
    if (f->shape != q.shape) {
      return "its Q of " + q.name + " has rank " + std::to_string(q.shape[1]) +
             ", this run's factors " + std::to_string(f->shape[1]);
    }
  }
  return "";
}

}  // namespace

void save_powersgd_state(ProcessGroup& comm, Replica& replica, PowerSgdCheckpoint& out) {
  out = PowerSgdCheckpoint{};
  const PowerSgdCommunicator* p = replica.powersgd();
  if (p == nullptr || !p->compressed_yet()) return;  // the same on every rank
  PowerSgdState state = p->state();
  const size_t total = replica.plan().total_numel;
  if (state.error.empty()) state.error.assign(total, 0.0f);  // zeros: the same as none
  const bool root = comm.rank() == 0;
  std::vector<float> all(root ? total * static_cast<size_t>(comm.size()) : 0);
  comm.gather(state.error.data(), total * sizeof(float), all.data(), 0);
  if (!root) return;
  out.error.resize(static_cast<size_t>(comm.size()));
  std::vector<float> one(total);
  for (size_t rank = 0; rank < out.error.size(); ++rank) {
    std::copy_n(all.begin() + static_cast<ptrdiff_t>(rank * total), total, one.begin());
    replica.named(one, out.error[rank]);
  }
  for (const Factored& f : factored_weights(replica, *p)) {
    const auto q = state.q.find(f.offset);
    if (q != state.q.end()) out.q.push_back({f.name, f.shape, q->second});
  }
}

std::string resume_powersgd_state(ProcessGroup& comm, Replica& replica,
                                  const PowerSgdCheckpoint& stored, int64_t global_step) {
  PowerSgdCommunicator* p = replica.powersgd();
  if (p == nullptr) return "";
  p->set_steps(global_step);
  const std::vector<Factored> factored = factored_weights(replica, *p);
  std::string why;
  if (comm.rank() == 0) why = unusable(stored, comm.size(), factored);
  why = broadcast_string(comm, why, 0);
  if (!why.empty()) {
    if (!p->compressed_yet()) return "";  // nothing to continue yet
    return "resume: PowerSGD's error feedback and Q start afresh (" + why +
           "): the run continues, not bitwise as the uninterrupted one would";
  }
  const size_t total = replica.plan().total_numel;
  PowerSgdState state;
  state.error.assign(total, 0.0f);
  std::vector<float> all;
  // Which factored weights have a Q, then their values in that order.
  std::vector<double> held(factored.size(), 0.0);
  std::vector<float> qs;
  if (comm.rank() == 0) {
    all.assign(total * static_cast<size_t>(comm.size()), 0.0f);
    std::vector<float> one(total, 0.0f);
    for (size_t rank = 0; rank < stored.error.size(); ++rank) {
      replica.place(stored.error[rank], one);
      std::copy(one.begin(), one.end(), all.begin() + static_cast<ptrdiff_t>(rank * total));
    }
    for (size_t i = 0; i < factored.size(); ++i) {
      for (const NamedTensor& q : stored.q) {
        if (q.name != factored[i].name) continue;
        held[i] = 1.0;
        qs.insert(qs.end(), q.data.begin(), q.data.end());
      }
    }
  }
  comm.scatter(all.data(), total * sizeof(float), state.error.data(), 0);
  if (!held.empty()) comm.broadcast(held.data(), held.size() * sizeof(double), 0);
  size_t floats = 0;
  for (size_t i = 0; i < factored.size(); ++i)
    if (held[i] != 0.0) floats += factored[i].numel();
  qs.resize(floats);
  if (!qs.empty()) comm.broadcast(qs.data(), qs.size() * sizeof(float), 0);
  size_t at = 0;
  for (size_t i = 0; i < factored.size(); ++i) {
    if (held[i] == 0.0) continue;
    state.q[factored[i].offset].assign(
        qs.begin() + static_cast<ptrdiff_t>(at),
        qs.begin() + static_cast<ptrdiff_t>(at + factored[i].numel()));
    at += factored[i].numel();
  }
  run_agreed(comm, [&] { p->restore(state); });
  return "";
}

}  // namespace ddp
