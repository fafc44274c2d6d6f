// `meshlm generate` (app/generate.h): the command line, the prompt, the
// generation loop and what it prints.
//
// The loop: the prompt runs once (prefill: its keys and values cached, the
// last position's logits kept), then each new token is picked from the
// logits of the position before it (model/sampling.h) and, unless it is the
// last, runs as one position against the cache. It stops after
// --max-new-tokens tokens, at the tokenizer's end-of-text id (printed with
// --print ids, not as text), or when the sequence fills the model's context.
#include "app/generate.h"

#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "app/generate_model.h"
#include "app/generate_text.h"
#include "comm/errors.h"
#include "core/cpu_set.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/suggest.h"
#include "core/timer.h"
#include "model/decode.h"
#include "model/sampling.h"
#include "mesh/mesh.h"
#include "ops/blas.h"
#include "train/backend.h"

namespace meshlm {

namespace {

const char* kGenerateUsage =
    "usage: meshlm generate MODEL (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
    "\n"
    "Continues a prompt with a model, one token at a time, on the CPU or a GPU (one\n"
    "rank; the other ranks of a job wait). The prompt runs once and its keys and\n"
    "values are cached, so each new token costs one position's forward.\n"
    "\n"
    "MODEL is one of:\n"
    "  DIR                 a Hugging Face model directory, GPT-2 or Llama (config.json and\n"
    "                      model.safetensors or the shards of its index)\n"
    "  FILE.safetensors    a GPT-2 file (GPT2Model's names); its shapes give the model and\n"
    "                      --n_head (default: the file's __metadata__ meshlm.n_head, else 12)\n"
    "  CKPT.h5             a meshlm checkpoint (a run's, or meshlm ckpt import's): /meta\n"
    "                      gives the model; a LoRA checkpoint runs its base merged with its\n"
    "                      adapters as `meshlm ckpt export --merge` makes it (the base of\n"
    "                      /meta quant_base, or --base)\n"
    "\n"
    "Options:\n"
    "  --prompt TEXT       the prompt as text, encoded by the tokenizer (its BOS id first,\n"
    "                      when it has one, unless --no-bos)\n"
    "  --prompt-ids LIST   the prompt as token ids: comma-separated whole numbers below\n"
    "                      the model's vocab_size (exactly one of --prompt, --prompt-ids)\n"
    "  --tokenizer PATH    tokenizer.json, GPT-2's vocab.json (with --merges FILE), a\n"
    "                      SentencePiece tokenizer.model, or a directory holding one.\n"
    "                      Default: MODEL itself when it is a directory holding one\n"
    "  --merges FILE       merges.txt of a vocab.json --tokenizer\n"
    "  --no-bos            do not put the tokenizer's BOS id before a --prompt\n"
    "  --max-new-tokens N  generate at most N tokens (default 64). The prompt and the new\n"
    "                      tokens must fit the model's context (max_seq_len, n_positions,\n"
    "                      max_position_embeddings): a longer prompt is an error; past\n"
    "                      the context generation stops, as the first line on stderr says\n"
    "  --temperature T     0: greedy (the argmax); else sample softmax(logits / T)\n"
    "                      (default 1)\n"
    "  --top-k K           sample among the K most likely tokens only (default 0: all)\n"
    "  --top-p P           then among the most likely tokens holding P of their\n"
    "                      probability (nucleus; default 1: all)\n"
    "  --seed S            the sampling's seed, a whole number (default 0): the same seed,\n"
    "                      model, options and backend give the same tokens on any machine\n"
    "  --print text|ids    text: the decoded text, streamed as the tokens come (the\n"
    "                      default when a tokenizer is known); ids: one line of the new\n"
    "                      token ids, comma-separated (the end-of-text id included\n"
    "                      when it ends the generation)\n"
    "  --base FILE|DIR     the base of a LoRA checkpoint instead of /meta quant_base\n"
    "                      (\"\": the initialisation of /meta seed); its XXH3-128 must\n"
    "                      match /meta base_hash\n"
    "  --n_head N          attention heads of a safetensors file\n"
    "  --backend B         cpu (default), cuda (the GPU of rank 0's node-local rank 0:\n"
    "                      its parameters, cache and scratch in device memory, fp32 with\n"
    "                      TF32 off; the logits come back to the host for sampling) or\n"
    "                      emulated (the CPU's ops on device memory the host cannot touch,\n"
    "                      for tests; runtime.backend's values)\n"
    "  --threads N         OpenMP and BLAS threads (default: the cores of the process's\n"
    "                      CPU affinity mask; under mpiexec, --bind-to none gives all)\n"
    "\n"
    "Generation stops after --max-new-tokens tokens, at the tokenizer's end-of-text id\n"
    "or one of the model's eos_token_id (a directory's generation_config.json, else its\n"
    "config.json; a checkpoint's, kept from the directory it came from), or when prompt\n"
    "and new tokens fill the context. Then a line on stderr gives the\n"
    "prefill's and the decode's tokens per second. Padded vocabulary rows are never\n"
    "chosen.\n";

struct GenerateOptions {
  GenerateModelOptions model;
  std::string tokenizer, merges, prompt, prompt_ids, print;
  bool has_prompt = false, has_ids = false, has_tokenizer = false, bos = true;
  int max_new = 64, threads = 0;
  ComputeBackend backend = ComputeBackend::cpu;
  SamplingOptions sampling;
  uint64_t seed = 0;
};

[[noreturn]] void bad(const std::string& what) {
  throw RankError(what + " (meshlm generate --help)", MESHLM_HERE);
}

// A whole number in [lo, hi] from an option's text.
long long whole(const std::string& key, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, v);
  if (text.empty() || r.ec != std::errc() || r.ptr != end || v < lo || v > hi)
    bad(fmt::format("{} '{}': not a whole number in [{}, {}]", key, log::printable(text), lo, hi));
  return v;
}

double real(const std::string& key, const std::string& text, double lo, double hi, bool open_lo) {
  double v = 0;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v >= lo) || !(v <= hi) || (open_lo && v == lo))
    bad(fmt::format("{} '{}': not a number in {}{}, {}]", key, log::printable(text),
                    open_lo ? "(" : "[", lo, hi));
  return v;
}

// The options set_option takes, and the flags parse takes, for the hint of
// an unknown one.
const std::vector<std::string> kOptionNames = {
    "--prompt", "--prompt-ids", "--tokenizer", "--merges", "--base", "--n_head",
    "--max-new-tokens", "--threads", "--backend", "--temperature", "--top-k", "--top-p", "--seed",
    "--print", "--no-bos", "--help"};

// Sets one option of `o` from `key` and `value`; false for an unknown key.
bool set_option(GenerateOptions& o, const std::string& key, const std::string& value) {
  if (key == "--prompt") o.prompt = value, o.has_prompt = true;
  else if (key == "--prompt-ids") o.prompt_ids = value, o.has_ids = true;
  else if (key == "--tokenizer") o.tokenizer = value, o.has_tokenizer = true;
  else if (key == "--merges") o.merges = value;
  else if (key == "--base") o.model.base = value, o.model.base_given = true;
  else if (key == "--n_head") o.model.n_head = static_cast<int>(whole(key, value, 1, 1 << 20));
  else if (key == "--max-new-tokens") o.max_new = static_cast<int>(whole(key, value, 1, 1 << 30));
  else if (key == "--threads") o.threads = static_cast<int>(whole(key, value, 1, 4096));
  else if (key == "--backend") {
    const std::optional<ComputeBackend> b = enum_from_name<ComputeBackend>(value);
    if (!b)
      bad("--backend '" + log::printable(value) + "': " + enum_choices<ComputeBackend>(" or "));
    o.backend = *b;
  }
  else if (key == "--temperature") o.sampling.temperature = real(key, value, 0, 1e6, false);
  else if (key == "--top-k") o.sampling.top_k = static_cast<int>(whole(key, value, 0, 1 << 30));
  else if (key == "--top-p") o.sampling.top_p = real(key, value, 0, 1, true);
  else if (key == "--seed")
    o.seed = static_cast<uint64_t>(whole(key, value, 0, std::numeric_limits<long long>::max()));
  else if (key == "--print") {
    if (value != "text" && value != "ids") bad("--print '" + log::printable(value) + "': text or ids");
    o.print = value;
  } else {
    return false;
  }
  return true;
}

// The command line; nullopt after --help.
std::optional<GenerateOptions> parse(const std::vector<std::string>& args) {
  GenerateOptions o;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return std::nullopt;
    if (a == "--no-bos") {
      o.bos = false;
      continue;
    }
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      positional.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) bad("option " + key + " needs a value");
      value = args[++i];
    }
    if (!set_option(o, key, value))
      bad("unknown option '" + log::printable(a) + "'" + did_you_mean(key, kOptionNames));
  }
  if (positional.size() != 1)
    bad(positional.empty() ? "no MODEL named" : "one MODEL at a time (got '" +
                                                    log::printable(positional[1]) + "' too)");
  o.model.path = positional[0];
  if (o.has_prompt == o.has_ids)
    bad(o.has_prompt ? "--prompt and --prompt-ids both given: one prompt at a time"
                     : "no prompt: give --prompt TEXT or --prompt-ids 1,2,3");
  if (!o.merges.empty() && !o.has_tokenizer) bad("--merges goes with --tokenizer vocab.json");
  return o;
}

// "1, 2,3" -> ids, each below V.
std::vector<int32_t> parse_ids(const std::string& text, int V) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
    unsigned long long v = 0;
    const char* end = item.data() + item.size();
    const auto r = std::from_chars(item.data(), end, v);
    if (item.empty() || r.ptr != end || (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
      bad("--prompt-ids '" + log::printable(text) + "': '" + log::printable(item) +
          "' is not a token id (comma-separated whole numbers)");
    if (r.ec == std::errc::result_out_of_range || v >= static_cast<unsigned long long>(V))
      bad(fmt::format("--prompt-ids: id {} is outside the model's vocabulary [0, {})",
                      log::printable(item), V));
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return ids;
}

// One generated id at a time, as --print says.
class IdsSink final : public TokenSink {
public:
  void put(uint32_t id) override {
    std::fprintf(stdout, first_ ? "%u" : ",%u", id);
    std::fflush(stdout);
    first_ = false;
  }
  void finish() override {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

private:
  bool first_ = true;
};

struct Timing {
  int prompt = 0, generated = 0;
  double prefill_s = 0, decode_s = 0;
};

// The loop of the file's comment; the prompt's tokens fit the decoder's context.
Timing generate(Decoder& dec, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                const std::vector<uint32_t>& stops, TokenSink& sink) {
  const int V = dec.config().vocab_size, Vp = dec.config().padded_vocab_size();
  std::vector<float> logits(static_cast<size_t>(Vp));
  Timing t;
  t.prompt = static_cast<int>(prompt.size());
  double t0 = now_seconds();
  dec.forward(prompt.data(), t.prompt, logits.data());
  t.prefill_s = now_seconds() - t0;
  t0 = now_seconds();
  Sampler sampler(o.sampling);
  Rng rng(o.seed);
  const int limit = std::min(o.max_new, dec.context() - t.prompt);
  while (t.generated < limit) {
    const uint32_t id = sampler.next({logits.data(), static_cast<size_t>(V)}, rng);
    sink.put(id);
    ++t.generated;
    if (std::find(stops.begin(), stops.end(), id) != stops.end() || t.generated == limit) break;
    const int32_t next = static_cast<int32_t>(id);
    dec.forward(&next, 1, logits.data());
  }
  t.decode_s = now_seconds() - t0;
  sink.finish();
  return t;
}

// Rank 0's work.
void run(const GenerateOptions& o) {
  const int threads = o.threads > 0 ? o.threads : std::max(1, current_cpu_set().count());
  ops::set_threads(threads);
  const double t0 = now_seconds();
  std::unique_ptr<GenerateModel> model = open_generate_model(o.model);
  const GPTConfig& cfg = model->config();
  const std::unique_ptr<TextCodec> text = open_text_codec(o.tokenizer, o.merges, o.has_tokenizer,
                                                          model->directory());
  const bool as_text = o.print.empty() ? text != nullptr : o.print == "text";
  if ((as_text || o.has_prompt) && !text)
    bad(std::string(o.has_prompt ? "--prompt" : "--print text") +
        " needs a tokenizer: give --tokenizer FILE (MODEL '" + o.model.path +
        "' is not a Hugging Face directory holding one)");
  const std::vector<int32_t> prompt =
      o.has_ids ? parse_ids(o.prompt_ids, cfg.vocab_size) : text->encode(o.prompt, o.bos, cfg.vocab_size);
  const int n = static_cast<int>(prompt.size()), T = cfg.max_seq_len;
  if (n == 0) bad("the prompt is empty: no token to start from");
  if (n > T)
    bad(fmt::format("the prompt's {} tokens are more than the model's context of {} positions "
                    "(max_seq_len: GPT-2's n_positions, a Llama's max_position_embeddings)",
                    n, T));
  const int context = static_cast<int>(std::min<long long>(T, static_cast<long long>(n) + o.max_new));
  // This rank alone: a mesh of one, whose GPU is its node's first.
  const ProcessMesh self(MPI_COMM_SELF, MeshLayout(1, 1, 1));
  std::unique_ptr<Backend> opened;
  try {
    opened = std::make_unique<Backend>(o.backend, self);
  } catch (const std::exception& e) {
    throw RankError(std::string("--backend ") + name_of(o.backend) + ": " + e.what(), MESHLM_HERE);
  }
  const Backend& backend = *opened;
  Decoder dec(cfg, context, Decoder::kChunkRows, backend.kernels());
  dec.load([&](const ParamSpec& p, float* out) { model->read_checked(p, out); });
  const double loaded_s = now_seconds() - t0;
  // A device's first kernels load their modules and open cuBLAS: a forward
  // of the prompt's first ids, then forgotten, so that the prefill's clock
  // times the prefill (the same ids follow: the cache starts again at 0).
  std::string warm;
  if (backend.caps().device_memory) {
    std::vector<float> scratch(static_cast<size_t>(cfg.padded_vocab_size()));
    const double w0 = now_seconds();
    dec.forward(prompt.data(), std::min(n, 8), scratch.data());
    dec.reset();
    warm = fmt::format(", device warmed up in {:.2f} s", now_seconds() - w0);
  }
  log::write_line(stderr, fmt::format("# generate: {} ({}), {} threads, loaded in {:.2f} s{}; "
                                      "backend {}\n",
                                      model->describe(), cfg.describe(), threads, loaded_s, warm,
                                      backend.describe()));
  if (static_cast<long long>(n) + o.max_new > T)
    log::write_line(stderr, fmt::format("# generate: the prompt's {} tokens and --max-new-tokens "
                                        "{} exceed the context of {} positions: at most {} new "
                                        "tokens\n",
                                        n, o.max_new, T, T - n));
  // The tokenizer's end-of-text id and the model's own end-of-sequence ids.
  std::vector<uint32_t> stops = model->eos_ids();
  if (text && text->eot()) stops.push_back(*text->eot());
  IdsSink ids;
  std::unique_ptr<TokenSink> streamed = as_text ? text->sink(prompt, stops) : nullptr;
  TokenSink& sink = as_text ? *streamed : static_cast<TokenSink&>(ids);
  const Timing t = generate(dec, prompt, o, stops, sink);
  auto rate = [](int n, double s) { return s > 0 ? n / s : 0.0; };
  log::write_line(stderr, fmt::format("# generate: prefill {} tokens in {:.3f} s ({:.1f} tokens/s), "
                                      "decode {} tokens in {:.3f} s ({:.1f} tokens/s)\n",
                                      t.prompt, t.prefill_s, rate(t.prompt, t.prefill_s),
                                      t.generated, t.decode_s, rate(t.generated, t.decode_s)));
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  std::optional<GenerateOptions> o;
  bool ok = true;
  std::string msg;
  if (log::rank() == 0) {
    try {
      o = parse(args);
      if (!o) std::fputs(kGenerateUsage, stdout);
      else run(*o);
    } catch (const std::exception& e) {
      ok = false;
      msg = std::string("meshlm generate: ") + e.what();
    }
    std::fflush(stdout);
  }
  check_all(MPI_COMM_WORLD, ok, msg, MESHLM_HERE);
  return 0;
}

}  // namespace meshlm
