#include "app/tokenize.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <sstream>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/suggest.h"
#include "core/timer.h"
#include "io/h5.h"
#include "io/token_writer.h"
#include "io/tokens.h"
#include "text/tokenizer.h"

namespace meshlm {

namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

const char* const kUsage =
    "usage: meshlm tokenize IN [IN ...] OUT.h5 [options]\n"
    "\n"
    "Tokenizes a corpus into a token file for data.path: each text file (or each\n"
    "line of a JSON-lines file) is one document; every document is followed by\n"
    "the end-of-text id and preceded by the tokenizer's BOS id where it has one.\n"
    "Under mpiexec -n N the ranks share the input at document boundaries and\n"
    "write one file, the same as one rank's. OUT.h5 holds /tokens (and\n"
    "/val_tokens with --val-fraction); docs/formats.md lists its attributes.\n";

struct Options {
  std::vector<std::string> inputs;
  std::string output, tokenizer = "byte", merges, input = "text", jsonl_key = "text", eot = "auto";
  double val_fraction = 0;
  bool skip_bad_lines = false;
};

Options parse_options(const std::vector<std::string>& args, bool* help) {
  Options o;
  std::vector<std::string> files;
  po::options_description d("options");
  d.add_options()
      ("help,h", "this text")
      ("tokenizer", po::value<std::string>(&o.tokenizer)->default_value("byte"),
       "byte (vocabulary 256, id = byte), a Hugging Face tokenizer.json (byte-level BPE), "
       "GPT-2's encoder.json/vocab.json (with --merges), a SentencePiece tokenizer.model, "
       "or a directory holding one of them")
      ("merges", po::value<std::string>(&o.merges)->default_value(""),
       "GPT-2's merges file (vocab.bpe or merges.txt) for an encoder.json/vocab.json; "
       "default: the one beside it")
      ("input", po::value<std::string>(&o.input)->default_value("text"),
       "text: each file is one document; jsonl: each line of each file is a JSON object "
       "whose --jsonl-key field is one document (empty lines are skipped)")
      ("jsonl-key", po::value<std::string>(&o.jsonl_key)->default_value("text"),
       "the field of a JSON line that holds the document's text")
      ("eot", po::value<std::string>(&o.eot)->default_value("auto"),
       "the id after each document: auto (the tokenizer's <|endoftext|>, <|end_of_text|> or "
       "</s>; a SentencePiece model's eos id; none for the byte tokenizer), none, or an id")
      ("val-fraction", po::value<double>(&o.val_fraction)->default_value(0),
       "hold out this fraction of the documents in /val_tokens (document i, counted from 0 "
       "in input order, when floor((i+1)F) > floor(iF)); 0 holds out none")
      ("skip-bad-lines", po::bool_switch(&o.skip_bad_lines),
       "with --input jsonl: skip (and count) lines that are not JSON objects with a string "
       "--jsonl-key field, instead of stopping at the first");
  po::options_description hidden;
  hidden.add_options()("files", po::value<std::vector<std::string>>(&files));
  po::options_description all;
  all.add(d).add(hidden);
  po::positional_options_description pos;
  pos.add("files", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::vector<std::string> known;
    for (const auto& opt : d.options()) known.push_back("--" + opt->long_name());
    throw CollectiveError(std::string("meshlm tokenize: ") + e.what() + " (meshlm tokenize --help)" +
                              did_you_mean(e.get_option_name(), known),
                          MESHLM_HERE);
  } catch (const po::error& e) {
    throw CollectiveError(std::string("meshlm tokenize: ") + e.what() + " (meshlm tokenize --help)",
                          MESHLM_HERE);
  }
  *help = vm.count("help") > 0;
  if (*help) {
    if (log::rank() == 0) {
      std::ostringstream ss;
      ss << d;
      std::printf("%s\n%s", kUsage, ss.str().c_str());
    }
    return o;
  }
  if (files.size() < 2)
    throw CollectiveError("usage: meshlm tokenize IN [IN ...] OUT.h5 [options]: at least one input "
                          "and the output file (meshlm tokenize --help)",
                          MESHLM_HERE);
  o.output = files.back();
  files.pop_back();
  o.inputs = files;
  if (o.input != "text" && o.input != "jsonl")
    throw CollectiveError("--input '" + o.input + "': must be text or jsonl", MESHLM_HERE);
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    throw CollectiveError(fmt::format("--val-fraction {}: must be in [0, 1)", o.val_fraction),
                          MESHLM_HERE);
  if (o.skip_bad_lines && o.input != "jsonl")
    throw CollectiveError("--skip-bad-lines goes with --input jsonl", MESHLM_HERE);
  return o;
}

// The input files, checked; sizes in input order.
std::vector<uint64_t> check_inputs(const Options& o) {
  std::vector<uint64_t> sizes;
  for (const std::string& in : o.inputs) {
    std::error_code ec;
    if (!fs::exists(in, ec)) throw RankError("input '" + in + "' does not exist", MESHLM_HERE);
    if (const std::string kind = non_regular_kind(in); !kind.empty())
      throw RankError("input '" + in + "' is " + kind + ", not a text file", MESHLM_HERE);
    if (same_file(in, o.output))
      throw RankError("input '" + in + "' is the output file: meshlm will not write over its input",
                      MESHLM_HERE);
    sizes.push_back(fs::file_size(in));
  }
  return sizes;
}

void check_output(const Options& o) {
  io::check_replaceable_token_file(o.output);
  const std::string dir = fs::path(o.output).parent_path().string();
  if (const std::string why = unwritable_dir_reason(dir.empty() ? "." : dir); !why.empty())
    throw RankError("output '" + o.output + "': '" + dir + "' " + why, MESHLM_HERE);
}

// What one rank tokenizes and what it got.
struct Part {
  std::vector<uint32_t> ids;
  std::vector<uint64_t> doc_end;  // ids.size() after each document
  uint64_t bytes = 0, bad_lines = 0;
};

class Tokenizing {
public:
  Tokenizing(const Options& o, const text::Tokenizer& tok, std::optional<uint32_t> eot,
             uint64_t my_bytes)
      : o_(o), tok_(tok), eot_(eot), bos_(tok.bos_id()),
        progress_("tokenize", static_cast<size_t>(std::max<uint64_t>(my_bytes, 1))),
        start_(now_seconds()) {}

  void document(std::string_view text) {
    if (bos_) part.ids.push_back(*bos_);
    tok_.encode(text, part.ids);
    if (eot_) part.ids.push_back(*eot_);
    part.doc_end.push_back(part.ids.size());
    part.bytes += text.size();
    progress_.update(static_cast<size_t>(part.bytes),
                     fmt::format("{:.1f} MB/s", part.bytes / 1e6 / std::max(seconds(), 1e-9)));
  }

  // One JSON line (without its newline); `where` names it for errors.
  void json_line(std::string_view line, const std::function<std::string()>& where) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
    std::string why;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.is_object()) why = "is not a JSON object";
      else if (!j.contains(o_.jsonl_key)) why = "has no key '" + o_.jsonl_key + "'";
      else if (!j[o_.jsonl_key].is_string()) why = "its '" + o_.jsonl_key + "' is not a string";
      else document(j[o_.jsonl_key].get_ref<const std::string&>());
    } catch (const nlohmann::json::parse_error& e) {
      // nlohmann quotes what it last read: bytes of the line, perhaps not UTF-8.
      why = "is not JSON (" + log::printable(e.what()) + ")";
    }
    if (why.empty()) return;
    if (!o_.skip_bad_lines)
      throw RankError(where() + " " + why + " (--skip-bad-lines skips such lines)", MESHLM_HERE);
    ++part.bad_lines;
  }

  double seconds() const { return now_seconds() - start_; }
  Part part;

private:
  const Options& o_;
  const text::Tokenizer& tok_;
  std::optional<uint32_t> eot_, bos_;
  ProgressBar progress_;
  double start_;
};

std::string read_range(const std::string& path, uint64_t begin, uint64_t end) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RankError("cannot open input '" + path + "'", MESHLM_HERE);
  std::string s(end - begin, '\0');
  in.seekg(static_cast<std::streamoff>(begin));
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  if (static_cast<uint64_t>(in.gcount()) != s.size())
    throw RankError(fmt::format("input '{}': read {} of {} bytes at offset {} (did it change?)",
                                path, in.gcount(), s.size(), begin),
                    MESHLM_HERE);
  return s;
}

uint64_t line_number(const std::string& path, uint64_t offset) {
  const std::string head = read_range(path, 0, offset);
  return 1 + static_cast<uint64_t>(std::count(head.begin(), head.end(), '\n'));
}

// The lines of `path` that start in [lo, hi) (offsets in the file): read
// from the first line start at or after lo to the end of the line that holds
// byte hi - 1.
void tokenize_lines(Tokenizing& t, const std::string& path, uint64_t size, uint64_t lo, uint64_t hi) {
  constexpr uint64_t kStep = uint64_t{1} << 20;
  std::string text = read_range(path, lo > 0 ? lo - 1 : 0, hi);
  uint64_t start = lo > 0 ? lo - 1 : 0;  // the file offset of text[0]
  size_t pos = 0;
  if (lo > 0) {
    const size_t nl = text.find('\n');
    if (nl == std::string::npos) return;  // no line starts in [lo, hi)
    pos = nl + 1;
  }
  for (uint64_t end = hi; end < size && (text.empty() || text.back() != '\n');) {
    const uint64_t next = std::min(size, end + kStep);
    const std::string more = read_range(path, end, next);
    const size_t nl = more.find('\n');
    text += nl == std::string::npos ? more : more.substr(0, nl + 1);
    end = nl == std::string::npos ? next : size;
  }
  while (pos < text.size() && start + pos < hi) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const uint64_t at = start + pos;
    t.json_line(std::string_view(text).substr(pos, nl - pos),
                [&] { return fmt::format("{} line {}:", path, line_number(path, at)); });
    pos = nl + 1;
  }
}

// This rank's documents: the files (text) or lines (jsonl) that start in its
// share [lo, hi) of the inputs' bytes taken end to end.
Part tokenize_share(const Options& o, const std::vector<uint64_t>& sizes, const text::Tokenizer& tok,
                    std::optional<uint32_t> eot, int rank, int ranks, double* seconds) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  auto bound = [&](int r) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(total) * r / ranks);
  };
  const uint64_t lo = bound(rank), hi = bound(rank + 1);
  Tokenizing t(o, tok, eot, hi - lo);
  uint64_t f0 = 0;
  for (size_t f = 0; f < o.inputs.size(); f0 += sizes[f], ++f) {
    if (o.input == "text") {
      // An empty file at the very end belongs to the last rank.
      const bool mine = (f0 >= lo && f0 < hi) || (f0 == total && rank == ranks - 1);
      if (mine) t.document(read_range(o.inputs[f], 0, sizes[f]));
      continue;
    }
    const uint64_t a = std::clamp(lo, f0, f0 + sizes[f]) - f0, b = std::clamp(hi, f0, f0 + sizes[f]) - f0;
    if (a < b) tokenize_lines(t, o.inputs[f], sizes[f], a, b);
  }
  *seconds = t.seconds();
  return std::move(t.part);
}

std::optional<uint32_t> resolve_eot(const std::string& eot, const text::Tokenizer& tok) {
  if (eot == "none") return std::nullopt;
  if (eot == "auto") return tok.eot_id();
  uint64_t id = 0;
  const auto r = std::from_chars(eot.data(), eot.data() + eot.size(), id);
  if (r.ec != std::errc() || r.ptr != eot.data() + eot.size())
    throw RankError("--eot '" + eot + "': must be auto, none or a token id", MESHLM_HERE);
  // An id past 32 bits is past every vocabulary (token ids are < 2^32 - 1).
  const auto id32 = static_cast<uint32_t>(std::min<uint64_t>(id, UINT32_MAX));
  if (!tok.has_token(id32))
    throw RankError(fmt::format("--eot {}: the id {}", id, tok.why_no_token(id32)), MESHLM_HERE);
  return id32;
}

template <typename T>
std::vector<T> gather(comm::Communicator& c, T value) {
  std::vector<T> all(static_cast<size_t>(c.size()));
  c.all_gather(&value, all.data(), sizeof(T), DType::u8).wait();
  return all;
}

struct Split {
  std::vector<uint32_t> train, val;
  uint64_t val_docs = 0;
};

// Document g (global index) is held out when floor((g+1) F) > floor(g F).
Split split_held_out(Part& part, uint64_t first_doc, double f) {
  Split s;
  if (f == 0) {
    s.train = std::move(part.ids);
    return s;
  }
  uint64_t begin = 0;
  for (size_t i = 0; i < part.doc_end.size(); ++i) {
    const double g = static_cast<double>(first_doc + i);
    const bool held = std::floor((g + 1) * f) > std::floor(g * f);
    auto& dst = held ? s.val : s.train;
    dst.insert(dst.end(), part.ids.begin() + static_cast<std::ptrdiff_t>(begin),
               part.ids.begin() + static_cast<std::ptrdiff_t>(part.doc_end[i]));
    s.val_docs += held;
    begin = part.doc_end[i];
  }
  part.ids.clear();
  part.ids.shrink_to_fit();
  return s;
}

// The inputs for a message: "a.txt, b.txt and 7 more".
std::string corpus_name(const Options& o) {
  std::string s;
  for (size_t i = 0; i < o.inputs.size() && i < 3; ++i) s += (i ? ", '" : "'") + o.inputs[i] + "'";
  if (o.inputs.size() > 3) s += fmt::format(" and {} more", o.inputs.size() - 3);
  return s;
}

uint64_t prefix(const std::vector<uint64_t>& v, int r) {
  uint64_t s = 0;
  for (int i = 0; i < r; ++i) s += v[static_cast<size_t>(i)];
  return s;
}

}  // namespace

int cmd_tokenize(MPI_Comm comm, const std::vector<std::string>& args) {
  bool help = false;
  const Options o = parse_options(args, &help);
  if (help) return 0;
  auto c = comm::make_mpi_communicator(comm);
  const int rank = c->rank(), ranks = c->size();
  const double start = now_seconds();

  std::vector<uint64_t> sizes;
  try_all(comm, "", [&] {
    sizes = check_inputs(o);
    if (rank == 0) check_output(o);
  }, MESHLM_HERE);
  std::unique_ptr<text::Tokenizer> tok;
  std::optional<uint32_t> eot;
  try_all(comm, "--tokenizer: ", [&] { tok = text::load_tokenizer(o.tokenizer, o.merges); }, MESHLM_HERE);
  // resolve_eot's messages name --eot themselves.
  try_all(comm, "", [&] { eot = resolve_eot(o.eot, *tok); }, MESHLM_HERE);

  double seconds = 0;
  Part part;
  try_all(comm, "", [&] { part = tokenize_share(o, sizes, *tok, eot, rank, ranks, &seconds); }, MESHLM_HERE);

  const auto docs = gather<uint64_t>(*c, part.doc_end.size());
  const auto bad = gather<uint64_t>(*c, part.bad_lines);
  const auto bytes = gather<uint64_t>(*c, part.bytes);
  const auto secs = gather<double>(*c, seconds);
  const uint64_t n_docs = prefix(docs, ranks), n_bad = prefix(bad, ranks), n_bytes = prefix(bytes, ranks);
  if (n_docs == 0)
    throw CollectiveError(fmt::format("the corpus ({}) has no document{}", corpus_name(o),
                                      n_bad ? fmt::format(" ({} bad lines skipped)", n_bad) : ""),
                          MESHLM_HERE);
  Split s = split_held_out(part, prefix(docs, rank), o.val_fraction);
  const auto ntrain = gather<uint64_t>(*c, s.train.size());
  const auto nval = gather<uint64_t>(*c, s.val.size());
  const auto vdocs = gather<uint64_t>(*c, s.val_docs);
  const uint64_t train_total = prefix(ntrain, ranks), val_total = prefix(nval, ranks);
  const uint64_t val_docs = prefix(vdocs, ranks);
  if (o.val_fraction > 0 && val_docs == 0)
    throw CollectiveError(fmt::format("--val-fraction {} holds out none of the {} documents",
                                      o.val_fraction, n_docs),
                          MESHLM_HERE);
  if (train_total == 0)
    throw CollectiveError(fmt::format("the corpus ({}) gives no tokens: {} empty document(s){}",
                                      corpus_name(o), n_docs - val_docs,
                                      eot ? "" : " and no end-of-text id (--eot)"),
                          MESHLM_HERE);

  uint32_t my_max = 0;
  for (uint32_t id : s.train) my_max = std::max(my_max, id);
  for (uint32_t id : s.val) my_max = std::max(my_max, id);
  const auto maxes = gather<uint32_t>(*c, my_max);

  io::TokenFileAttrs a;
  a.vocab_size = tok->vocab_size();
  a.eot_id = eot ? static_cast<int64_t>(*eot) : -1;
  a.bos_id = tok->bos_id() ? static_cast<int64_t>(*tok->bos_id()) : -1;
  a.documents = n_docs - val_docs;
  a.val_documents = val_docs;
  a.bytes_read = n_bytes;
  a.tokenizer = tok->kind();
  a.max_id = *std::max_element(maxes.begin(), maxes.end());
  if (o.tokenizer != "byte") {
    a.tokenizer_file = tok->files.at(0);
    try_all(comm, "--tokenizer: ", [&] {
      if (rank != 0) return;
      a.tokenizer_xxh3 = io::file_xxh3(tok->files.at(0));
      if (tok->files.size() > 1) a.merges_xxh3 = io::file_xxh3(tok->files[1]);
    }, MESHLM_HERE);
    c->broadcast(&a.tokenizer_xxh3, 8, DType::u8, 0).wait();
    c->broadcast(&a.merges_xxh3, 8, DType::u8, 0).wait();
  }

  std::unique_ptr<io::h5::AtomicWrite> out;
  std::string tmp;
  try_all(comm, "", [&] {
    if (rank == 0) {
      out = std::make_unique<io::h5::AtomicWrite>(o.output);
      tmp = out->tmp_path();
    }
  }, MESHLM_HERE);
  tmp = comm::broadcast_string(*c, tmp);
  const io::TokenPart train{s.train.data(), ntrain[rank], prefix(ntrain, rank), train_total};
  const io::TokenPart val{s.val.data(), nval[rank], prefix(nval, rank), val_total};
  try_all(comm, "", [&] { io::write_token_file(tmp, comm, train, val, a); }, MESHLM_HERE);
  try_all(comm, "", [&] { if (out) out->commit(); }, MESHLM_HERE);

  const double tok_seconds = *std::max_element(secs.begin(), secs.end());
  log::info("tokenize: {} documents ({} held out), {} + {} tokens (vocabulary {}, eot {}) from {:.1f} MB "
            "in {:.2f} s -> {}",
            n_docs, val_docs, train_total, val_total, a.vocab_size,
            eot ? std::to_string(*eot) : "none", n_bytes / 1e6, now_seconds() - start, o.output);
  log::info("tokenize: {:.2f} MB/s per rank on {} rank(s) ({:.2f} MB/s in all, tokenizing only)",
            n_bytes / 1e6 / std::max(tok_seconds, 1e-9) / ranks, ranks,
            n_bytes / 1e6 / std::max(tok_seconds, 1e-9));
  if (n_bad) log::info("tokenize: skipped {} bad lines (--skip-bad-lines)", n_bad);
  return 0;
}

}  // namespace meshlm
