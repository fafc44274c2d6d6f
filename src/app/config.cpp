#include "app/config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"

namespace po = boost::program_options;

namespace meshlm {

namespace {

// The text of a default as a user would write it: 0.1, not 0.10000000000000001.
std::string text_of(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(const std::string& v) { return v.empty() ? "\"\"" : v; }
template <typename T>
std::string text_of(const T& v) { return std::to_string(v); }

// A typed option bound to `field`, with the field's current value as default.
template <typename T>
po::typed_value<T>* opt(T* field) {
  return po::value(field)->default_value(*field, text_of(*field));
}

// The option table: one line per key. Kept in one function so that the
// parser, --help and the resolved-config dump can never disagree.
constexpr unsigned kHelpWidth = 100;  // columns of --help

po::options_description make_options(RunConfig& c) {
  po::options_description model("[model] the GPT-2 architecture", kHelpWidth, kHelpWidth / 2);
  model.add_options()
    ("model.n_layer", opt(&c.model.n_layer), "transformer blocks (L)")
    ("model.n_head", opt(&c.model.n_head), "attention heads (NH); must divide n_embd")
    ("model.n_embd", opt(&c.model.n_embd), "channels (C)")
    ("model.vocab_size", opt(&c.model.vocab_size), "vocabulary (V); padded to a multiple of 64 inside; 256 for byte-level data")
    ("model.seq_len", opt(&c.train.seq_len), "training sequence length (T); at most max_seq_len")
    ("model.max_seq_len", opt(&c.model.max_seq_len), "rows of the position table wpe; at least seq_len (GPT-2 uses 1024)");
  po::options_description train("[train] optimisation", kHelpWidth, kHelpWidth / 2);
  train.add_options()
    ("train.steps", opt(&c.train.steps), "optimizer steps")
    ("train.batch_size", opt(&c.train.batch_size), "sequences per optimizer step")
    ("train.micro_batch_size", opt(&c.train.micro_batch_size), "sequences per forward/backward; gradients accumulate over batch_size / micro_batch_size micro-batches; 0 = batch_size")
    ("train.lr", opt(&c.train.lr), "peak learning rate")
    ("train.lr_min_ratio", opt(&c.train.lr_min_ratio), "final learning rate of the cosine decay, as a fraction of lr")
    ("train.warmup_steps", opt(&c.train.warmup_steps), "steps of linear warmup before the cosine decay")
    ("train.weight_decay", opt(&c.train.weight_decay), "AdamW decoupled weight decay (matrices only)")
    ("train.grad_clip", opt(&c.train.grad_clip), "clip the global gradient norm to this; 0 = off")
    ("train.beta1", opt(&c.train.beta1), "AdamW beta1")
    ("train.beta2", opt(&c.train.beta2), "AdamW beta2")
    ("train.eps", opt(&c.train.eps), "AdamW epsilon")
    ("train.seed", opt(&c.train.seed), "seed of weight init and data shuffling; same seed, same run, bit for bit")
    ("train.log_every", opt(&c.train.log_every), "print and record metrics every this many steps (and at the last)");
  po::options_description data("[data] training tokens", kHelpWidth, kHelpWidth / 2);
  data.add_options()
    ("data.path", opt(&c.data.path), "token file: HDF5 with dataset 'tokens' (uint16/uint32) or meshlm raw tokens (required)")
    ("data.tokenize_from", opt(&c.data.tokenize_from), "text file tokenized byte-level into data.path when data.path does not exist")
    ("data.shuffle", opt(&c.data.shuffle), "visit sequences in a seeded random order (true) or in file order (false)");
  po::options_description output("[output] results", kHelpWidth, kHelpWidth / 2);
  output.add_options()
    ("output.dir", opt(&c.output.dir), "directory of run.h5 (metrics, memory, timing, resolved configuration)");
  po::options_description runtime("[runtime] the process", kHelpWidth, kHelpWidth / 2);
  runtime.add_options()
    ("runtime.threads", opt(&c.runtime.threads), "OpenMP/BLAS threads per rank; 0 = cores of the node / ranks on the node");
  po::options_description all(kHelpWidth, kHelpWidth / 2);
  all.add(model).add(train).add(data).add(output).add(runtime);
  return all;
}

[[noreturn]] void fail(const std::string& msg) { throw CollectiveError(msg, MESHLM_HERE); }

// Every key with its final value, grouped by section, as an INI text.
std::string resolved_ini(const po::options_description& desc, const po::variables_map& vm) {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> sections;
  std::vector<std::string> order;
  for (const auto& opt : desc.options()) {
    const std::string& key = opt->long_name();
    const auto dot = key.find('.');
    const std::string section = key.substr(0, dot);
    const boost::any& v = vm[key].value();
    std::string s;
    if (auto p = boost::any_cast<int>(&v)) s = std::to_string(*p);
    else if (auto p = boost::any_cast<uint64_t>(&v)) s = std::to_string(*p);
    else if (auto p = boost::any_cast<bool>(&v)) s = text_of(*p);
    else if (auto p = boost::any_cast<std::string>(&v)) s = *p;
    else if (auto p = boost::any_cast<double>(&v)) s = text_of(*p);
    if (!sections.count(section)) order.push_back(section);
    sections[section].emplace_back(key.substr(dot + 1), s);
  }
  std::string out;
  for (const auto& sec : order) {
    out += "[" + sec + "]\n";
    for (const auto& [k, v] : sections[sec]) out += k + " = " + v + "\n";
  }
  return out;
}

// "--key=value" and "--key value" to one "--key" "value" pair per key, in
// first-seen order, the LAST value of a key winning: a job script may put
// its defaults before the user's overrides.
std::vector<std::string> normalise_overrides(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() < 3)
      fail("unexpected argument '" + a + "': overrides are written --section.key=value");
    std::string key, value;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      key = a;
      value = args[++i];
    } else {
      fail("command line: " + a + " needs a value (--section.key=value)");
    }
    auto same = [&](const auto& p) { return p.first == key; };
    if (auto it = std::find_if(kv.begin(), kv.end(), same); it != kv.end()) it->second = value;
    else kv.emplace_back(key, value);
  }
  std::vector<std::string> out;
  for (auto& [k, v] : kv) {
    out.push_back(k);
    out.push_back(v);  // the two-word form also takes an empty value
  }
  return out;
}

void validate(const RunConfig& c) {
  c.model.validate();
  const auto& t = c.train;
  auto positive = [](int v, const char* key) {
    if (v < 1) fail(std::string(key) + " must be >= 1 (got " + std::to_string(v) + ")");
  };
  positive(t.seq_len, "model.seq_len");
  positive(t.steps, "train.steps");
  positive(t.batch_size, "train.batch_size");
  positive(t.micro_batch_size, "train.micro_batch_size");
  positive(t.log_every, "train.log_every");
  if (t.seq_len > c.model.max_seq_len)
    fail("model.seq_len (" + std::to_string(t.seq_len) + ") is longer than the position table, model.max_seq_len (" +
         std::to_string(c.model.max_seq_len) + ")");
  if (t.batch_size % t.micro_batch_size != 0)
    fail("train.batch_size (" + std::to_string(t.batch_size) + ") must be a multiple of train.micro_batch_size (" +
         std::to_string(t.micro_batch_size) + ")");
  if (!(t.lr > 0)) fail("train.lr must be > 0");
  if (t.lr_min_ratio < 0 || t.lr_min_ratio > 1) fail("train.lr_min_ratio must lie in [0, 1]");
  if (t.warmup_steps < 0) fail("train.warmup_steps must be >= 0");
  if (t.weight_decay < 0) fail("train.weight_decay must be >= 0");
  if (t.grad_clip < 0) fail("train.grad_clip must be >= 0 (0 turns clipping off)");
  if (t.beta1 < 0 || t.beta1 >= 1) fail("train.beta1 must lie in [0, 1)");
  if (t.beta2 < 0 || t.beta2 >= 1) fail("train.beta2 must lie in [0, 1)");
  if (!(t.eps > 0)) fail("train.eps must be > 0");
  if (c.data.path.empty()) fail("data.path is required (a token file; see data.tokenize_from)");
  if (c.output.dir.empty()) fail("output.dir must not be empty");
  if (c.runtime.threads < 0) fail("runtime.threads must be >= 0 (0 = automatic)");
}

}  // namespace

RunConfig parse_run_config(const std::string& text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  RunConfig c;
  po::options_description desc = make_options(c);
  po::variables_map vm;
  // The command line is stored first: program_options keeps the first value
  // stored for a key, so an override beats the file.
  try {
    po::store(po::command_line_parser(normalise_overrides(overrides))
                  .options(desc)
                  .style(po::command_line_style::default_style &
                         ~po::command_line_style::allow_guessing)
                  .run(),
              vm);
  } catch (const po::error& e) {
    fail("command line: " + std::string(e.what()));
  }
  try {
    std::istringstream in(text);
    po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    fail(source + ": unknown key '" + e.get_option_name() + "' (see meshlm train --help)");
  } catch (const po::invalid_option_value& e) {
    fail(source + ": " + e.what());
  } catch (const po::error& e) {
    fail(source + ": " + e.what());
  }
  if (c.train.micro_batch_size == 0) c.train.micro_batch_size = c.train.batch_size;
  validate(c);
  c.source = source;
  c.resolved = resolved_ini(desc, vm);
  return c;
}

RunConfig load_run_config(MPI_Comm comm, const std::string& path,
                          const std::vector<std::string>& overrides) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string text;
  bool ok = true;
  if (rank == 0) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      ok = false;
    } else {
      std::ostringstream s;
      s << in.rdbuf();
      text = s.str();
    }
  }
  check_all(comm, ok, "cannot read parameter file '" + path + "'", MESHLM_HERE);
  long len = static_cast<long>(text.size());
  MPI_Bcast(&len, 1, MPI_LONG, 0, comm);
  text.resize(len);
  MPI_Bcast(text.data(), static_cast<int>(len), MPI_CHAR, 0, comm);
  return parse_run_config(text, path, overrides);
}

std::string run_config_help() {
  RunConfig c;
  std::ostringstream o;
  o << make_options(c);
  return o.str();
}

}  // namespace meshlm
