// libFuzzer harness for the config loader (ddp::parse_config). The input up to the first NUL
// byte is the YAML text; each further NUL-separated piece is a --set override ("key.path=value").
// A config it accepts must survive to_yaml and back: the printed form is a fixed point.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/config.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  for (size_t start = nul; start != std::string::npos && start < input.size();) {
    const size_t next = input.find('\0', start + 1);
    overrides.push_back(
        input.substr(start + 1, next == std::string::npos ? next : next - start - 1));
    start = next;
  }
  bool parsed = false;
  ddp::TrainConfig cfg;
  ddp::fuzz::expect_only_ddp_errors([&] {
    cfg = ddp::parse_config(yaml, "fuzz.yaml", overrides);
    parsed = true;
  });
  if (!parsed) return 0;
  const std::string printed = ddp::to_yaml(cfg);
  try {
    const std::string reprinted = ddp::to_yaml(ddp::parse_config(printed, "printed.yaml"));
    if (reprinted != printed) {
      std::fprintf(stderr, "==fuzz== to_yaml is not a fixed point:\n%s\n---- reprinted:\n%s\n",
                   printed.c_str(), reprinted.c_str());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "==fuzz== to_yaml output of an accepted config is rejected: %s\n%s\n",
                 e.what(), printed.c_str());
    std::abort();
  }
  return 0;
}
