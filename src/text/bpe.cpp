#include "text/bpe.h"

#include <algorithm>
#include <queue>

#include <fmt/format.h>

#include "core/error.h"

namespace meshlm::text {

namespace {

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: the printable bytes keep their code point, the
// others (controls, space, 0x7F-0xA0, 0xAD) take 256, 257, ... in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> chars;
  std::unordered_map<uint32_t, uint8_t> byte_of;  // code point -> byte
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      chars[b] = utf8_of(cp);
      byte_of[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The raw bytes of a vocabulary token written in the byte alphabet. A
// character outside the alphabet (a token no byte-level input can produce)
// keeps its own UTF-8 bytes.
std::string raw_bytes(const std::string& token) {
  const auto& a = alphabet();
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const auto c = static_cast<unsigned char>(token[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len && i + k < token.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
    const auto it = a.byte_of.find(cp);
    if (it != a.byte_of.end())
      out += static_cast<char>(it->second);
    else
      out.append(token, i, len);
    i += len;
  }
  return out;
}

uint32_t checked_id(uint64_t id, const std::string& token, const std::string& source) {
  if (id >= UINT32_MAX)
    throw RankError(fmt::format("{}: token '{}' has id {}, which does not fit 32 bits: meshlm "
                                "reads vocabularies of fewer than 2^32 tokens",
                                source, token, id),
                    MESHLM_HERE);
  return static_cast<uint32_t>(id);
}

constexpr size_t kCachedPieceBytes = 64;   // longer pieces are merged each time
constexpr size_t kCacheEntries = 1 << 18;  // the cache starts afresh beyond this

}  // namespace

const std::string& byte_char(uint8_t b) { return alphabet().chars[b]; }

BpeTokenizer::BpeTokenizer(const BpeSpec& spec)
    : ignore_merges_(spec.ignore_merges) {
  uint64_t size = 0;
  for (const auto& [tok, id] : spec.vocab) size = std::max(size, checked_id(id, tok, spec.source) + uint64_t{1});
  for (const auto& a : spec.added) size = std::max(size, checked_id(a.id, a.content, spec.source) + uint64_t{1});
  bytes_.resize(size);
  assigned_.assign(size, false);
  std::vector<const std::string*> name(size, nullptr);
  auto assign = [&](const std::string& shown, uint32_t id, std::string bytes) {
    if (assigned_[id] && bytes_[id] != bytes)
      throw RankError(fmt::format("{}: tokens '{}' and '{}' have the same id {}", spec.source,
                                  *name[id], shown, id),
                      MESHLM_HERE);
    assigned_[id] = true;
    name[id] = &shown;
    bytes_[id] = std::move(bytes);
  };
  for (const auto& [tok, id] : spec.vocab) {
    std::string raw = raw_bytes(tok);
    assign(tok, static_cast<uint32_t>(id), raw);
    by_bytes_.emplace(std::move(raw), static_cast<uint32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
    if (it == by_bytes_.end())
      throw RankError(fmt::format("{}: the vocabulary has no token for byte 0x{:02x} ('{}'): "
                                  "not a byte-level BPE vocabulary",
                                  spec.source, b, byte_char(static_cast<uint8_t>(b))),
                      MESHLM_HERE);
    byte_id_[b] = it->second;
  }
  std::unordered_map<std::string, uint32_t> by_token;
  for (const auto& [tok, id] : spec.vocab) by_token.emplace(tok, static_cast<uint32_t>(id));
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [l, rt] = spec.merges[r];
    auto id_of = [&](const std::string& t) {
      const auto it = by_token.find(t);
      if (it == by_token.end())
        throw RankError(fmt::format("{}: merge {} ('{} {}') names '{}', which is not in the "
                                    "vocabulary",
                                    spec.source, r + 1, l, rt, t),
                        MESHLM_HERE);
      return it->second;
    };
    const uint64_t key = (uint64_t{id_of(l)} << 32) | id_of(rt);
    // A merge listed twice keeps its first (best) rank, as a rank table does.
    merges_.emplace(key, Merge{static_cast<uint32_t>(r), id_of(l + rt)});
  }
  for (const auto& a : spec.added) {
    if (a.content.empty())
      throw RankError(spec.source + ": an added token has empty content", MESHLM_HERE);
    assign(a.content, static_cast<uint32_t>(a.id), a.content);
    AddedTokens& pass = a.normalized ? normalized_added_ : raw_added_;
    pass.tokens.emplace_back(a.content, static_cast<uint32_t>(a.id));
    pass.first[static_cast<unsigned char>(a.content[0])] = true;
  }
  // Leftmost-longest: at one position the longest added token wins.
  for (AddedTokens* pass : {&raw_added_, &normalized_added_})
    std::stable_sort(pass->tokens.begin(), pass->tokens.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (const auto& step : spec.pre_tokenizer)
    steps_.push_back({step.add_prefix_space,
                      step.pattern.empty() ? nullptr : std::make_unique<Regex>(step.pattern, spec.source)});
  if (spec.bos) bos_ = checked_id(*spec.bos, "bos", spec.source);
}

size_t BpeTokenizer::AddedTokens::find(std::string_view text, size_t from, size_t* which) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first[static_cast<unsigned char>(text[i])]) continue;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (text.compare(i, tokens[k].first.size(), tokens[k].first) == 0) {
        *which = k;
        return i;
      }
    }
  }
  return std::string_view::npos;
}

template <typename F>
void BpeTokenizer::AddedTokens::split(std::string_view text, std::vector<uint32_t>& out,
                                      F&& between) const {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t which = 0;
    const size_t at = tokens.empty() ? std::string_view::npos : find(text, pos, &which);
    const size_t end = at == std::string_view::npos ? text.size() : at;
    if (end > pos) between(text.substr(pos, end - pos));
    if (at == std::string_view::npos) break;
    out.push_back(tokens[which].second);
    pos = at + tokens[which].first.size();
  }
}

void BpeTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  std::lock_guard lock(mutex_);
  // Hugging Face's AddedVocabulary::extract_and_normalize: the added tokens
  // that are not normalized split the text first, the normalized ones then
  // split each stretch left (meshlm reads no normalizer: its bytes as they
  // are).
  raw_added_.split(text, out, [&](std::string_view part) {
    normalized_added_.split(part, out, [&](std::string_view segment) { encode_segment(segment, out); });
  });
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<uint32_t>& out) const {
  // The first step's prefix space goes before the whole stretch: Hugging
  // Face's pieces before the first step are the stretches between added
  // tokens.
  std::string prefixed;
  if (!steps_.empty() && steps_[0].add_prefix_space && text.front() != ' ') {
    prefixed = " ";
    prefixed += text;
    text = prefixed;
  }
  spaced_.clear();
  // Valid UTF-8 runs go through the steps; a run of bytes that is not UTF-8
  // is a piece of its own (bytes are bytes).
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t valid = valid_utf8_prefix(text.substr(pos));
    if (valid > 0) {
      pieces_.clear();
      pieces_.push_back(text.substr(pos, valid));
      for (size_t k = 0; k < steps_.size(); ++k) {
        // A later ByteLevel's space goes before each piece of the steps
        // before it (byte_level.rs: every split not starting with ' ').
        if (k > 0 && steps_[k].add_prefix_space)
          for (auto& p : pieces_) {
            if (p.front() == ' ') continue;
            std::string& spaced = spaced_.emplace_back(1, ' ');
            spaced += p;
            p = spaced;
          }
        if (!steps_[k].regex) continue;
        subpieces_.clear();
        for (auto p : pieces_) steps_[k].regex->split(p, subpieces_);
        pieces_.swap(subpieces_);
      }
      for (auto p : pieces_) encode_piece(p, out);
      pos += valid;
    }
    size_t bad = pos;
    while (bad < text.size() && valid_utf8_prefix(text.substr(bad, 4)) == 0) ++bad;
    if (bad > pos) {
      encode_piece(text.substr(pos, bad - pos), out);
      pos = bad;
    }
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    const auto it = by_bytes_.find(std::string(piece));
    if (it != by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCachedPieceBytes) {
    merge_piece(piece, out);
    return;
  }
  std::string key(piece);
  const auto it = cache_.find(key);
  if (it != cache_.end()) {
    out.insert(out.end(), cache_pool_.begin() + it->second.first,
               cache_pool_.begin() + it->second.first + it->second.second);
    return;
  }
  if (cache_.size() >= kCacheEntries) {
    cache_.clear();
    cache_pool_.clear();
  }
  const size_t first = out.size();
  merge_piece(piece, out);
  const auto start = static_cast<uint32_t>(cache_pool_.size());
  cache_pool_.insert(cache_pool_.end(), out.begin() + first, out.end());
  cache_.emplace(std::move(key), std::pair{start, static_cast<uint32_t>(out.size() - first)});
}

void BpeTokenizer::merge_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  // Symbols in a linked list; candidate pairs in a min-heap by (rank,
  // position). An entry whose symbols changed since it was pushed is stale.
  struct Sym {
    uint32_t id;
    int prev, next;
  };
  std::vector<Sym> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    sym[i] = {byte_id_[static_cast<unsigned char>(piece[i])], static_cast<int>(i) - 1,
              i + 1 < piece.size() ? static_cast<int>(i) + 1 : -1};
  struct Cand {
    uint32_t rank;
    int pos, right;
    uint32_t left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int a) {
    if (a < 0 || sym[a].next < 0) return;
    const int b = sym[a].next;
    const auto it = merges_.find((uint64_t{sym[a].id} << 32) | sym[b].id);
    if (it != merges_.end()) heap.push({it->second.rank, a, b, sym[a].id, sym[b].id});
  };
  for (int i = 0; i + 1 < static_cast<int>(piece.size()); ++i) push(i);
  std::vector<bool> dead(piece.size(), false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || dead[c.right] || sym[c.pos].next != c.right || sym[c.pos].id != c.left_id ||
        sym[c.right].id != c.right_id)
      continue;
    sym[c.pos].id = merges_.at((uint64_t{c.left_id} << 32) | c.right_id).id;
    dead[c.right] = true;
    sym[c.pos].next = sym[c.right].next;
    if (sym[c.pos].next >= 0) sym[sym[c.pos].next].prev = c.pos;
    push(sym[c.pos].prev);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::string BpeTokenizer::token_bytes(uint32_t id) const {
  if (!has_token(id)) throw RankError(fmt::format("token id {} {}", id, why_no_token(id)), MESHLM_HERE);
  return bytes_[id];
}

std::optional<uint32_t> BpeTokenizer::token_id(std::string_view content) const {
  for (const AddedTokens* pass : {&raw_added_, &normalized_added_})
    for (const auto& [c, id] : pass->tokens)
      if (c == content) return id;
  const auto it = by_bytes_.find(std::string(content));
  if (it == by_bytes_.end()) return std::nullopt;
  return it->second;
}

}  // namespace meshlm::text
