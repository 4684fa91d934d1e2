// One copy of the data per node (data.share_on_node): the node's first rank writes each split
// into memory every rank of the node maps, and training reads it there. The same batches as a
// copy per rank, so bitwise the same weights, from IDX bytes and from CSV floats, and from the
// .npy conversion of the IDX files, which every rank maps; the mapping's fallback and failure
// paths reach every rank alike.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/node_shared_memory.h"
#include "core/check.h"
#include "data/convert.h"
#include "ddp/trainer.h"
#include "mpi_test_helpers.h"
#include "temp_files.h"

namespace {

using ddp_test::bitwise_equal;
using ddp_test::require_identical_replicas;

std::string shared_scratch(const std::string& name) {
  return ddp_test::shared_scratch_dir("ddp_node_data_", name);
}

// The job key the share_on_node tests pass (node_job_key gives letters and digits too).
const std::string kJob = "test1";

void put_be32(std::ofstream& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out.write(b, 4);
}

// Raw (not gzipped) IDX files of `n` 2x3 images with varied bytes and labels in [0, 5).
void write_idx(const std::string& images, const std::string& labels, uint32_t n, uint32_t salt) {
  std::ofstream img(images, std::ios::binary), lbl(labels, std::ios::binary);
  put_be32(img, 0x00000803);
  put_be32(img, n);
  put_be32(img, 2);
  put_be32(img, 3);
  put_be32(lbl, 0x00000801);
  put_be32(lbl, n);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < 6; ++j) img.put(static_cast<char>((i * 37 + j * 11 + salt) % 256));
    lbl.put(static_cast<char>((i * 3 + salt) % 5));
  }
}

ddp::TrainConfig idx_config(const std::string& dir) {
  ddp::TrainConfig cfg = ddp_test::small_training_config(dir);
  cfg.model.layers = {6, 16, 5};
  cfg.data.format = ddp::DataFormat::Idx;
  cfg.data.dir = dir;
  cfg.data.train.images = "train-images";
  cfg.data.train.labels = "train-labels";
  cfg.data.test.images = "test-images";
  cfg.data.test.labels = "test-labels";
  cfg.data.normalize.mode = ddp::Normalization::Mode::Standardize;
  cfg.training.batch_size = 5;
  cfg.training.epochs = 2;
  return cfg;
}

// train(), and whether rank 0's startup log says `line` (by default: the node shares one copy),
// on every rank.
std::vector<ddp::NamedTensor> train_noting_sharing(const ddp::TrainConfig& cfg, bool* shared,
                                                   const char* line = "data: one copy per node") {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  std::ostringstream log;
  ddp::Trainer trainer(cfg, *comm, &log);
  trainer.run();
  int said = log.str().find(line) != std::string::npos;
  MPI_Bcast(&said, 1, MPI_INT, 0, MPI_COMM_WORLD);
  *shared = said != 0;
  return trainer.weights();
}

}  // namespace

TEST_CASE("one copy of the data per node trains bitwise as a copy per rank", "[mpi][data]") {
  const int n = ddp_test::world_size();
  const std::string dir = shared_scratch("train");
  if (ddp_test::world_rank() == 0) {
    write_idx(dir + "/train-images", dir + "/train-labels", 97, 1);
    write_idx(dir + "/test-images", dir + "/test-labels", 31, 2);
    std::ofstream csv(dir + "/train.csv");
    for (int i = 0; i < 90; ++i)
      csv << (i % 13) * 0.25 << ',' << -(i % 7) * 1.5 << ',' << i * 0.01 << ',' << i % 3 << '\n';
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ddp::TrainConfig csv = ddp_test::small_training_config(dir + "/csv");
  csv.model.layers = {3, 8, 3};
  csv.data.format = ddp::DataFormat::Csv;
  csv.data.train.path = dir + "/train.csv";
  for (const ddp::TrainConfig& base : {idx_config(dir), csv}) {
    INFO("data.format " << (base.data.format == ddp::DataFormat::Idx ? "idx (bytes)" : "csv"));
    ddp::TrainConfig own = base, shared = base;
    own.data.share_on_node = false;
    own.output.dir += "/own";
    shared.output.dir += "/shared";
    bool own_said = true, shared_said = false;
    const auto a = train_noting_sharing(own, &own_said);
    const auto b = train_noting_sharing(shared, &shared_said);
    CHECK_FALSE(own_said);
    CHECK(shared_said == (n > 1));  // every rank of these tests runs on one node
    require_identical_replicas(b);
    REQUIRE(bitwise_equal(a, b));
  }
}

TEST_CASE("IDX files and their .npy conversion train bitwise alike, the .npy mapped by every rank",
          "[mpi][data]") {
  const std::string dir = shared_scratch("npy");
  if (ddp_test::world_rank() == 0) {
    write_idx(dir + "/train-images", dir + "/train-labels", 97, 3);
    write_idx(dir + "/test-images", dir + "/test-labels", 31, 4);
    for (const std::string split : {"train", "test"}) {
      ddp::ConvertRequest r;
      r.format = "idx";
      r.images = dir + "/" + split + "-images";
      r.labels = dir + "/" + split + "-labels";
      r.out = dir + "/" + split;
      ddp::convert_to_npy(r);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const ddp::TrainConfig idx = idx_config(dir);  // shared per node where there are 2+ ranks
  ddp::TrainConfig npy = idx;
  npy.data.format = ddp::DataFormat::Npy;
  npy.output.dir += "/npy";
  for (const std::string split : {"train", "test"}) {
    ddp::SplitSource& s = split == "train" ? npy.data.train : npy.data.test;
    s.images.clear();
    s.features = split + "/features.npy";
    s.labels = split + "/labels.npy";
  }
  bool unused = false, mapped = false;
  const auto a = train_noting_sharing(idx, &unused);
  const auto b = train_noting_sharing(npy, &mapped,
                                      "data: features read in place from the "
                                      "memory-mapped .npy files");
  CHECK(mapped);
  require_identical_replicas(b);
  REQUIRE(bitwise_equal(a, b));
}

// Stand-in nodes of different sizes (blocks of three ranks: 3 and 1 at four ranks). Sharing is
// collective over the job, so the node of one rank must take the same path as the other: the
// run shares, trains bitwise as a copy per rank, and no rank meets another's collective.
TEST_CASE("nodes of different sizes share alike and train bitwise as a copy per rank",
          "[mpi][data]") {
  const int n = ddp_test::world_size();
  if (n < 4) {
    WARN("skipped: needs 4 ranks (nodes of 3 and 1)");
    return;
  }
  const std::string dir = shared_scratch("uneven");
  if (ddp_test::world_rank() == 0) {
    write_idx(dir + "/train-images", dir + "/train-labels", 97, 1);
    write_idx(dir + "/test-images", dir + "/test-labels", 31, 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<ddp::NamedTensor> weights[2];
  bool said[2] = {false, false};
  for (const bool share : {false, true}) {
    ddp::TrainConfig cfg = idx_config(dir);
    cfg.data.share_on_node = share;
    cfg.output.dir = dir + (share ? "/shared" : "/own");
    auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD, 3);
    std::ostringstream log;
    ddp::Trainer trainer(cfg, *comm, &log);
    trainer.run();
    weights[share] = trainer.weights();
    int says = log.str().find("data: one copy per node") != std::string::npos;
    MPI_Bcast(&says, 1, MPI_INT, 0, MPI_COMM_WORLD);
    said[share] = says != 0;
  }
  CHECK_FALSE(said[0]);
  CHECK(said[1]);
  require_identical_replicas(weights[1]);
  REQUIRE(bitwise_equal(weights[0], weights[1]));
}

// Two stand-in nodes (halves of the job) that run the same config, whose relative data.dir
// holds other files on each (each node's ranks work in their own directory): every rank stops
// with one message that says the data differs, never a hang or a partial start. With a copy per
// node, files of different sizes are found as the first ranks share them; files of the same size
// but other labels, by the data's fingerprint after it.
TEST_CASE("nodes that read different data stop every rank with a message", "[mpi][data]") {
  const int n = ddp_test::world_size();
  if (n < 2 || n % 2 != 0) return;  // needs two nodes of equal size
  const std::string dir = shared_scratch("differ");
  if (ddp_test::world_rank() == 0) {
    const std::pair<const char*, std::pair<uint32_t, uint32_t>> nodes[] = {
        {"/same", {97, 1}}, {"/fewer", {96, 1}}, {"/relabelled", {97, 3}}};
    for (const auto& [node, shape] : nodes) {
      const std::string data = dir + node + "/data";
      std::filesystem::create_directories(data);
      write_idx(data + "/train-images", data + "/train-labels", shape.first, shape.second);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const bool second_node = ddp_test::world_rank() >= n / 2;
  const std::string fewer =
      "data differs from rank 0's: rank 0 has 'data.train: 97 samples of 6 "
      "features (uint8 / 255), labels crc32 ";
  struct Case {
    const char* other;  // the second node's directory
    bool share;
    std::string says;
  };
  const Case cases[] = {
      // Nodes of one rank share nothing: the fingerprint finds it.
      {"/fewer", true,
       n > 2 ? "data.train: the nodes read different data: their first ranks' copies hold 1088 to "
               "1094 bytes"
             : fewer},
      {"/fewer", false, fewer},
      {"/relabelled", true, "labels crc32"},
      {"/relabelled", false, "labels crc32"},
  };
  const std::filesystem::path cwd = std::filesystem::current_path();
  for (const Case& c : cases) {
    INFO("the second node reads " << c.other << ", share_on_node " << c.share);
    auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD, n / 2);  // one per Trainer
    std::filesystem::current_path(dir + (second_node ? c.other : "/same"));
    ddp::TrainConfig cfg = idx_config("data");
    cfg.data.test.images.clear();
    cfg.data.test.labels.clear();
    cfg.data.share_on_node = c.share;
    cfg.output.dir = dir + "/out";
    std::ostringstream log;
    CHECK_THROWS_WITH(
        ddp::Trainer(cfg, *comm, &log).run(),
        Catch::Contains(c.says) && Catch::Contains("every rank must read the same files"));
    std::filesystem::current_path(cwd);
  }
}

TEST_CASE("share_on_node: the first rank's bytes on every rank; no room falls back everywhere",
          "[mpi][data]") {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  const std::string dir = shared_scratch("shm");
  const size_t bytes = 4096 + 3;
  auto fill = [&](void* out) {
    auto* p = static_cast<unsigned char*>(out);
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 1);
  };
  const ddp::NodeSharedMemory mem = ddp::share_on_node(*comm, bytes, fill, kJob, dir);
  REQUIRE(mem.data != nullptr);
  REQUIRE(mem.bytes == bytes);
  long wrong = 0;
  const auto* p = static_cast<const unsigned char*>(mem.data.get());
  for (size_t i = 0; i < bytes; ++i) wrong += p[i] != static_cast<unsigned char>(i * 7 + 1);
  ddp_test::require_on_all_ranks(*comm, wrong, "bytes that differ from the first rank's");
  // The name is gone once every rank has the mapping: nothing is left behind.
  comm->barrier();
  CHECK(std::filesystem::is_empty(dir));
  // Ranks whose output directories are spelt apart pass other keys: rank 0's names the copy.
  const ddp::NodeSharedMemory keyed =
      ddp::share_on_node(*comm, bytes, fill, "rank" + std::to_string(comm->rank()), dir);
  ddp_test::require_on_all_ranks(*comm, keyed.data == nullptr, "ranks without the copy");
  comm->barrier();
  CHECK(std::filesystem::is_empty(dir));

  // A directory that cannot hold it: every rank learns so, and why.
  const ddp::NodeSharedMemory none = ddp::share_on_node(*comm, bytes, fill, kJob, dir + "/missing");
  CHECK(none.data == nullptr);
  CHECK_THAT(none.why_not,
             Catch::Contains(dir + "/missing/ddp-") && Catch::Contains("cannot create"));

  // A directory that cannot hold the bytes: the node's first rank under a file-size cap (EFBIG),
  // and on a full tmpfs (ENOSPC, where this process may mount one). Every rank learns why, and
  // nothing is left behind.
  {
    std::optional<ddp_test::FileSizeLimit> cap;
    if (comm->local_rank() == 0) cap.emplace(4096);
    const ddp::NodeSharedMemory capped = ddp::share_on_node(*comm, bytes, fill, kJob, dir);
    cap.reset();
    CHECK(capped.data == nullptr);
    CHECK_THAT(capped.why_not, Catch::Contains("cannot hold 4099 bytes (" +
                                               std::string(std::strerror(EFBIG)) + ")"));
    comm->barrier();
    CHECK(std::filesystem::is_empty(dir));
  }
  {
    // Beside `dir`, not in it: the other ranks may still be checking that `dir` is empty.
    const std::string tiny = shared_scratch("shm_full");
    std::optional<ddp_test::TinyTmpfs> full;
    int mounted = 0;
    if (comm->rank() == 0) {
      full.emplace(tiny, "size=4k");
      mounted = full->ok();
    }
    MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (mounted) {
      const ddp::NodeSharedMemory none_left = ddp::share_on_node(
          *comm, 64 * 1024, [](void*) {}, kJob, tiny);
      CHECK(none_left.data == nullptr);
      CHECK_THAT(none_left.why_not, Catch::Contains("cannot hold 65536 bytes (" +
                                                    std::string(std::strerror(ENOSPC)) + ")"));
      comm->barrier();
      CHECK(std::filesystem::is_empty(tiny));
    } else {
      WARN("full tmpfs: skipped (mounting needs root)");
    }
    comm->barrier();
    if (comm->rank() == 0) {
      full.reset();  // unmounted
      std::filesystem::remove(tiny);
    }
    comm->barrier();
  }

  // A failing fill fails every rank, and leaves nothing behind.
  auto failing = [](void*) { DDP_THROW("data.train: x.idx: truncated data"); };
  CHECK_THROWS_WITH(ddp::share_on_node(*comm, bytes, failing, kJob, dir),
                    Catch::Contains("x.idx: truncated data"));
  comm->barrier();
  CHECK(std::filesystem::is_empty(dir));
}

// Ranks standing in for two nodes on one machine share one directory, as two real nodes never
// do: each node's ranks still map their own first rank's copy (named by its pid), not the other
// node's.
TEST_CASE("share_on_node: each node's ranks map their own first rank's copy", "[mpi][data]") {
  const int n = ddp_test::world_size();
  if (n < 2 || n % 2 != 0) return;  // needs two nodes of equal size
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD, n / 2);
  const std::string dir = shared_scratch("two_nodes");
  const size_t bytes = 1000;
  const int node = comm->rank() / (n / 2);
  const auto byte = [](int node_of, size_t i) {
    return static_cast<unsigned char>(i + 50 * node_of);
  };
  const ddp::NodeSharedMemory mem = ddp::share_on_node(
      *comm, bytes,
      [&](void* out) {
        for (size_t i = 0; i < bytes; ++i) static_cast<unsigned char*>(out)[i] = byte(node, i);
      },
      kJob, dir);
  INFO("why not: " << mem.why_not);
  long wrong = mem.data == nullptr ? 1 : 0;
  for (size_t i = 0; mem.data && i < bytes; ++i)
    wrong += static_cast<const unsigned char*>(mem.data.get())[i] != byte(node, i);
  ddp_test::require_on_all_ranks(*comm, wrong, "bytes that are not this node's first rank's");
  comm->barrier();
  CHECK(std::filesystem::is_empty(dir));
}

namespace {

// A pid no process has: a child's, once it has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

std::string copy_name(const std::string& job, pid_t pid, const char* random) {
  return "ddp-" + std::to_string(::geteuid()) + "-" + job + "-" + std::to_string(pid) + "-" +
         random;
}

void plant(const std::string& path) {
  std::ofstream(path) << "left behind";
  REQUIRE(std::filesystem::exists(path));
}

}  // namespace

// A job killed between creating its node's copy and unlinking it leaves the copy behind; the
// next run of the same job removes it, and only it. Planted in a scratch directory on rank 0.
TEST_CASE("a dead run's copy of the node's data is swept; a live, foreign or other job's is kept",
          "[mpi][data]") {
  auto comm = ddp::make_mpi_communicator(MPI_COMM_WORLD);
  if (comm->rank() == 0) {
    ddp_test::TempDir tmp("ddp_sweep");
    const std::string dir = tmp.path().string();
    const pid_t dead = dead_pid();
    const std::string gone = tmp.file(copy_name("jobA", dead, "1f"));
    const std::string alive = tmp.file(copy_name("jobA", ::getppid(), "2f"));
    const std::string other_job = tmp.file(copy_name("jobB", dead, "3f"));
    const std::string not_a_file = tmp.file(copy_name("jobA", dead, "4f"));
    const std::string not_a_copy = tmp.file("ddp-notes-" + std::to_string(dead));
    const std::string foreign = tmp.file(copy_name("jobA", dead, "5f"));
    for (const std::string& path : {gone, alive, other_job, not_a_copy, foreign}) plant(path);
    std::filesystem::create_directory(not_a_file);
    // Another user's copy (the name says our uid, the owner does not): root can make one.
    const bool chowned = ::geteuid() == 0 && ::chown(foreign.c_str(), 4242, 4242) == 0;
    if (!chowned) std::filesystem::remove(foreign);

    const std::vector<std::string> removed = ddp::sweep_dead_copies(dir, "jobA");
    REQUIRE(removed.size() == 1);
    CHECK_THAT(removed[0], Catch::Contains("removed " + gone) &&
                               Catch::Contains("process " + std::to_string(dead) + " is gone"));
    CHECK_FALSE(std::filesystem::exists(gone));
    CHECK(std::filesystem::exists(alive));  // its creator (this process's parent) still runs
    CHECK(std::filesystem::exists(other_job));
    CHECK(std::filesystem::exists(not_a_file));
    CHECK(std::filesystem::exists(not_a_copy));
    if (chowned) {
      CHECK(std::filesystem::exists(foreign));
    } else {
      WARN("another user's copy: not tried (chown needs root)");
    }
    CHECK(ddp::sweep_dead_copies(dir, "jobA").empty());
    CHECK(ddp::sweep_dead_copies(dir + "/missing", "jobA").empty());
  }
  comm->barrier();

  // Through share_on_node: the first rank sweeps before it creates, and every rank learns it.
  const std::string dir = shared_scratch("sweep");
  std::string planted;
  if (comm->rank() == 0) {
    planted = dir + "/" + copy_name(kJob, dead_pid(), "9");
    plant(planted);
  }
  planted = ddp::broadcast_string(*comm, planted, 0);
  comm->barrier();
  const ddp::NodeSharedMemory mem = ddp::share_on_node(
      *comm, 64, [](void* out) { std::memset(out, 7, 64); }, kJob, dir);
  CHECK(mem.data != nullptr);
  REQUIRE(mem.swept.size() == 1);
  CHECK_THAT(mem.swept[0], Catch::Contains("removed " + planted));
  comm->barrier();
  CHECK(std::filesystem::is_empty(dir));
}

TEST_CASE("a job's copies are named by its Slurm job id, else by its output directory",
          "[mpi][data]") {
  CHECK(ddp::node_job_key("4711", "runs/a") == "slurm4711");
  CHECK(ddp::node_job_key("4711", "runs/b") == "slurm4711");  // a requeued job keeps its id
  const std::string a = ddp::node_job_key(nullptr, "runs/a");
  CHECK(a.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") == std::string::npos);
  CHECK(ddp::node_job_key(nullptr, "./runs/x/../a/") == a);
  CHECK(ddp::node_job_key(nullptr, (std::filesystem::current_path() / "runs/a").string()) == a);
  CHECK(ddp::node_job_key("", "runs/a") == a);
  CHECK(ddp::node_job_key(nullptr, "runs/b") != a);
  CHECK(ddp::node_job_key("12-x", "runs/a") == a);  // not a job id: never part of a name
}
