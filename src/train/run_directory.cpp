// The directories of a run (run_directory.h).
#include "train/run_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/check.h"
#include "io/training_checkpoint.h"

namespace ddp {

namespace {

namespace fs = std::filesystem;

std::string parent_of(const std::string& path) {
  const std::string parent = fs::path(path).lexically_normal().parent_path().string();
  return parent.empty() ? "." : parent;
}

// A link another user planted in a shared folder (sticky and writable by all, as /tmp) is not
// followed: the kernel's fs.protected_symlinks rule, kept whatever the machine's setting.
void refuse_planted_link(const std::string& path, const std::string& key) {
  struct stat link {};
  struct stat folder {};
  if (::lstat(path.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return;
  if (::stat(parent_of(path).c_str(), &folder) != 0) return;
  const bool shared = (folder.st_mode & S_ISVTX) != 0 && (folder.st_mode & S_IWOTH) != 0;
  DDP_CHECK(!shared || link.st_uid == ::geteuid() || link.st_uid == folder.st_uid,
            key << ": '" << path << "' is a symbolic link of another user (uid " << link.st_uid
                << ") in the shared folder '" << parent_of(path) << "': not followed");
}

void make_directory(const std::string& dir, const std::string& key) {
  refuse_planted_link(dir, key);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DDP_CHECK(!ec, key << ": cannot create " << dir << ": " << ec.message());
  DDP_CHECK(fs::is_directory(dir, ec), key << ": '" << dir << "' is not a directory");
}

// Whether `inner` is `outer` or inside it (checkpoint.dir defaults to <output.dir>/checkpoints).
bool inside(const std::string& inner, const std::string& outer) {
  const fs::path a = fs::weakly_canonical(inner), b = fs::weakly_canonical(outer);
  auto mismatch = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return mismatch.first == b.end();
}

std::string utc_stamp() {
  char text[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

// A new folder "<dir>/<prefix>-<stamp>[-n]": mkdir fails on an existing one, so two calls in
// one second get two folders.
std::string new_folder(const std::string& dir, const std::string& prefix) {
  const std::string stem = dir + "/" + prefix + "-" + utc_stamp();
  for (int n = 1; n < 1000; ++n) {
    const std::string folder = n == 1 ? stem : stem + "-" + std::to_string(n);
    if (::mkdir(folder.c_str(), 0777) == 0) return folder;
    DDP_CHECK(errno == EEXIST, "cannot create " << folder << ": " << std::strerror(errno));
  }
  DDP_THROW("cannot create a folder " << stem << "-N: all names are taken");
}

std::vector<std::string> existing(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) out.push_back(p);
  }
  return out;
}

std::string count_of(size_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::string set_aside(const std::vector<std::string>& paths, const std::string& dir,
                      const std::string& prefix) {
  const std::string folder = new_folder(dir, prefix);
  for (const std::string& path : paths) {
    const std::string to = folder + "/" + fs::path(path).filename().string();
    DDP_CHECK(::rename(path.c_str(), to.c_str()) == 0,
              "cannot move " << path << " to " << folder << ": " << std::strerror(errno));
  }
  return folder;
}

void RunDirectory::claim(const TrainConfig& cfg) {
  const std::string& out = cfg.output.dir;
  make_directory(out, "output.dir");
  lock(out, "output.dir");
  const std::string checkpoints = cfg.checkpoint.directory(out);
  if (!inside(checkpoints, out)) {
    make_directory(checkpoints, "checkpoint.dir");
    lock(checkpoints, "checkpoint.dir");
  }
  refuse_planted_link(checkpoints, "checkpoint.dir");
  const auto earlier = list_checkpoints(checkpoints);
  if (cfg.training.start_over) {
    start_over(cfg, checkpoints);
  } else if (cfg.training.resume.empty() && !earlier.empty()) {
    DDP_THROW("checkpoint.dir: " << checkpoints << " holds "
                                 << count_of(earlier.size(), "checkpoint")
                                 << " of an earlier run (the newest " << earlier.back().second
                                 << "): continue it with --resume auto, or start over with "
                                    "--start-over (its files are moved aside, not deleted), or "
                                    "choose another output.dir");
  }
  for (const std::string& dir : {out, checkpoints}) {
    const std::vector<std::string> swept = remove_abandoned_temporaries(dir);
    if (!swept.empty())
      notes_.push_back("removed " + count_of(swept.size(), "temporary file") +
                       " of interrupted writes in " + dir + " (their writers are gone)");
  }
}

void RunDirectory::lock(const std::string& dir, const std::string& key) {
  locks_.emplace_back(dir, key);
  if (!locks_.back().warning().empty()) notes_.push_back(locks_.back().warning());
}

// An earlier run's files, moved into a folder beside them (never deleted).
void RunDirectory::start_over(const TrainConfig& cfg, const std::string& checkpoint_dir) {
  std::vector<std::string> files;
  for (const char* name : RunFiles::kAll) files.push_back(RunFiles::in(cfg, name));
  std::vector<std::string> checkpoints;
  for (const auto& [step, path] : list_checkpoints(checkpoint_dir)) checkpoints.push_back(path);
  files = existing(files);
  if (!files.empty())
    notes_.push_back("start over: the earlier run's " + count_of(files.size(), "file") +
                     " moved to " + set_aside(files, cfg.output.dir, "earlier-run"));
  if (!checkpoints.empty())
    notes_.push_back("start over: the earlier run's " + count_of(checkpoints.size(), "checkpoint") +
                     " moved to " + set_aside(checkpoints, checkpoint_dir, "earlier-run"));
}

}  // namespace ddp
