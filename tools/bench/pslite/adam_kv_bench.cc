// A ps-lite job doing what shardopt_bench's section (e) times: one worker
// pushes an fp32 gradient of --mib MiB to one server, the server applies Adam
// (torch.optim's formula, bias-corrected) to the keys it receives, and the
// worker pulls the updated values back. Written against ps-lite's public API
// (KVWorker / KVServer) for tools/bench/pslite_compare.py, which builds
// ps-lite from a source snapshot in a temporary folder and this file with it;
// neither is part of shardopt's build.
//
// --key_mib > 0 splits the values into keys of that size, every push in
// flight at once and each key's pull sent as soon as its push is
// acknowledged (the server has updated it); 0 sends the whole gradient as one
// key (ps-lite's single-message mode). The worker
// prints one line: "RESULT steps=N median_ms=X min_ms=Y".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

struct Options {
  int mib = 64;
  int key_mib = 4;
  double seconds = 3.0;
  int min_steps = 3;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return a.compare(0, n, name) == 0 ? a.c_str() + n : nullptr;
    };
    if (const char* v = value("--mib=")) o.mib = std::atoi(v);
    else if (const char* v = value("--key_mib=")) o.key_mib = std::atoi(v);
    else if (const char* v = value("--seconds=")) o.seconds = std::atof(v);
    else if (const char* v = value("--min_steps=")) o.min_steps = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      std::exit(2);
    }
  }
  return o;
}

// Adam state of one key, allocated at its first push.
struct KeyState {
  std::vector<float> params, exp_avg, exp_avg_sq;
  int64_t step = 0;
};

constexpr float kLr = 1e-4f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;

void AdamUpdate(KeyState& s, const float* grad, size_t n) {
  if (s.params.size() != n) {
    s.params.assign(n, 0.5f);
    s.exp_avg.assign(n, 0.0f);
    s.exp_avg_sq.assign(n, 0.0f);
  }
  ++s.step;
  const float bias1 = 1.0f - std::pow(kBeta1, static_cast<float>(s.step));
  const float bias2_sqrt = std::sqrt(1.0f - std::pow(kBeta2, static_cast<float>(s.step)));
  const float step_size = kLr / bias1;
  float* p = s.params.data();
  float* m = s.exp_avg.data();
  float* v = s.exp_avg_sq.data();
  for (size_t i = 0; i < n; ++i) {
    m[i] = kBeta1 * m[i] + (1.0f - kBeta1) * grad[i];
    v[i] = kBeta2 * v[i] + (1.0f - kBeta2) * grad[i] * grad[i];
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + kEps);
  }
}

void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& data,
            ps::KVServer<float>* server) {
  static std::unordered_map<ps::Key, KeyState> states;  // (The customer thread alone.)
  ps::KVPairs<float> reply;
  if (meta.push) {
    size_t at = 0;
    for (size_t k = 0; k < data.keys.size(); ++k) {
      const size_t n = data.lens.empty() ? data.vals.size() : static_cast<size_t>(data.lens[k]);
      AdamUpdate(states[data.keys[k]], data.vals.data() + at, n);
      at += n;
    }
  } else {
    // Zero-copy replies: the values stay where the state holds them.
    size_t total = 0;
    for (ps::Key key : data.keys) total += states[key].params.size();
    reply.keys = data.keys;
    if (data.keys.size() == 1) {
      KeyState& s = states[data.keys[0]];
      reply.vals = ps::SArray<float>(s.params.data(), s.params.size(), false);
    } else {
      reply.vals.resize(total);
      size_t at = 0;
      for (ps::Key key : data.keys) {
        const std::vector<float>& p = states[key].params;
        std::memcpy(reply.vals.data() + at, p.data(), p.size() * sizeof(float));
        at += p.size();
      }
    }
    for (ps::Key key : data.keys) reply.lens.push_back(static_cast<int>(states[key].params.size()));
  }
  server->Response(meta, reply);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void RunWorker(const Options& o) {
  ps::KVWorker<float> kv(0, 0);
  const size_t total = static_cast<size_t>(o.mib) << 18;  // Floats.
  const size_t per_key = o.key_mib > 0 ? static_cast<size_t>(o.key_mib) << 18 : total;
  const size_t keys = (total + per_key - 1) / per_key;
  std::vector<float> grads(total), params(total);
  for (size_t i = 0; i < total; ++i) grads[i] = std::sin(static_cast<float>(i % 4096)) * 1e-2f;
  // Keys spread over the key space as ps-lite's examples do (one server owns it all).
  std::vector<ps::SArray<ps::Key>> key_of(keys);
  std::vector<ps::SArray<float>> grad_of(keys), param_of(keys);
  std::vector<ps::SArray<int>> len_of(keys), pulled_len_of(keys);
  for (size_t k = 0; k < keys; ++k) {
    const size_t n = std::min(per_key, total - k * per_key);
    key_of[k] = ps::SArray<ps::Key>(1, static_cast<ps::Key>(k));
    grad_of[k] = ps::SArray<float>(grads.data() + k * per_key, n, false);
    param_of[k] = ps::SArray<float>(params.data() + k * per_key, n, false);
    len_of[k] = ps::SArray<int>(1, static_cast<int>(n));
  }
  std::vector<int> pushes(keys), pulls(keys);
  const auto step = [&] {
    for (size_t k = 0; k < keys; ++k) pushes[k] = kv.ZPush(key_of[k], grad_of[k], len_of[k]);
    // ps-lite may hand a server a later small request before an earlier
    // large one: each pull goes once its key's push is acknowledged (while
    // the later pushes still stream).
    for (size_t k = 0; k < keys; ++k) {
      kv.Wait(pushes[k]);
      pulls[k] = kv.ZPull(key_of[k], &param_of[k], &pulled_len_of[k]);
    }
    for (int ts : pulls) kv.Wait(ts);
  };
  step();  // Warm-up (the server allocates its state).
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < static_cast<size_t>(o.min_steps) ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             o.seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
    if (times.size() >= 1000) break;
  }
  if (!std::isfinite(params[total - 1]) || params[total - 1] == 0.0f) {
    std::fprintf(stderr, "the pulled values were not updated\n");
    std::exit(1);
  }
  std::printf("RESULT steps=%zu median_ms=%.3f min_ms=%.3f\n", times.size(), Median(times),
              *std::min_element(times.begin(), times.end()));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  ps::Start(0);
  ps::KVServer<float>* server = nullptr;
  if (ps::IsServer()) {
    server = new ps::KVServer<float>(0);
    server->set_request_handle(Handle);
  }
  if (ps::IsWorker()) RunWorker(options);
  ps::Finalize(0, true);
  delete server;
  return 0;
}
