#include "core/suggest.h"

#include <algorithm>
#include <cctype>

namespace meshlm {

namespace {

constexpr size_t kMaxEdits = 2;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Edits from a to b (Levenshtein), counted up to cap: cap + 1 means more.
size_t edits_within(std::string_view a, std::string_view b, size_t cap) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > cap) return cap + 1;
  std::vector<size_t> row(b.size() + 1), next(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    next[0] = i;
    size_t least = next[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      next[j] = std::min({row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
      least = std::min(least, next[j]);
    }
    if (least > cap) return cap + 1;  // every later row is at least this far
    std::swap(row, next);
  }
  return std::min(row[b.size()], cap + 1);
}

}  // namespace

std::string nearest_name(std::string_view word, const std::vector<std::string>& names) {
  if (word.empty() || word.size() > 100) return "";
  const std::string want = lower(word);
  std::string nearest;
  size_t least = kMaxEdits + 1;
  for (const std::string& name : names)
    if (const size_t d = edits_within(want, lower(name), kMaxEdits); d < least) {
      least = d;
      nearest = name;
    }
  return nearest;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& names) {
  const std::string n = nearest_name(word, names);
  return n.empty() ? "" : "; did you mean '" + n + "'?";
}

}  // namespace meshlm
