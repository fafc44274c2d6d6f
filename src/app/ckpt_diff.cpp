// meshlm ckpt diff A B [--top N] [--format table|tsv]
//
// Both datasets of a pair are read in lock-step, the same block of rows of
// each (BlockReader's blocks depend on the shape alone), so two checkpoints
// of any size are compared with two blocks in memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "app/ckpt_tools.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/checkpoint_file.h"

namespace meshlm::ckpt_tools {

namespace h5 = io::h5;

namespace {

struct PairDiff {
  std::string path;
  std::string shape;
  double rel = 0, max_abs = 0, norm_a = 0, norm_b = 0;
  bool identical = true;
};

// ||a - b||, ||a||, ||b||, max |a - b| in double over every element; a
// NaN difference (a NaN or an Inf on either side that the other does not
// match) makes rel and max_abs NaN.
PairDiff compare(hid_t fa, hid_t fb, const DatasetInfo& d, ProgressBar& bar, uint64_t& done) {
  h5::Dataset da = h5::open_dataset(fa, d.path), db = h5::open_dataset(fb, d.path);
  BlockReader ra(da), rb(db);
  double diff2 = 0, a2 = 0, b2 = 0, max_abs = 0;
  bool identical = true, nan_diff = false;
  for (;;) {
    const std::span<const double> a = ra.next(), b = rb.next();
    MESHLM_CHECK(a.size() == b.size(), d.path + ": blocks of equal shapes differ in size");
    if (a.empty()) break;
    for (size_t i = 0; i < a.size(); ++i) {
      const bool same = a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]));
      if (same) {
        a2 += a[i] * a[i];
        b2 += b[i] * b[i];
        continue;
      }
      identical = false;
      const double e = a[i] - b[i];
      if (std::isnan(e)) nan_diff = true;
      diff2 += e * e;
      a2 += a[i] * a[i];
      b2 += b[i] * b[i];
      max_abs = std::max(max_abs, std::abs(e));
    }
    done += 2 * a.size();
    bar.update(static_cast<size_t>(done), d.path);
  }
  PairDiff p;
  p.path = d.path;
  p.shape = shape_string(d.shape);
  p.norm_a = std::sqrt(a2);
  p.norm_b = std::sqrt(b2);
  p.rel = std::sqrt(diff2) / std::max(p.norm_a, kTinyNorm);
  p.max_abs = max_abs;
  if (nan_diff) p.rel = p.max_abs = std::numeric_limits<double>::quiet_NaN();
  p.identical = identical;
  return p;
}

// Largest first; a NaN above everything; ties by name.
bool larger(const PairDiff& x, const PairDiff& y) {
  const bool nx = std::isnan(x.rel), ny = std::isnan(y.rel);
  if (nx != ny) return nx;
  if (!nx && x.rel != y.rel) return x.rel > y.rel;
  if (!nx && x.max_abs != y.max_abs) return x.max_abs > y.max_abs;
  return x.path < y.path;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The attributes of `where` ("/" or "meta") that differ between the files.
size_t diff_attrs(hid_t fa, hid_t fb, const std::string& where) {
  auto attrs_of = [&](hid_t f) {
    std::map<std::string, AttrText> out;
    if (where != "/" && !h5::exists(f, where)) return out;
    h5::Group g = h5::open_group(f, where);
    for (AttrText& a : read_attrs(g)) out.emplace(a.name, std::move(a));
    return out;
  };
  const std::map<std::string, AttrText> a = attrs_of(fa), b = attrs_of(fb);
  std::set<std::string> names;
  for (const auto& [n, v] : a) names.insert(n);
  for (const auto& [n, v] : b) names.insert(n);
  const std::string prefix = where == "/" ? "/" : fmt::format("/{}:", where);
  auto shown = [](const AttrText& t) {
    return t.is_string ? fmt::format("'{}'", log::printable(t.value, 200)) : t.value;
  };
  size_t differ = 0;
  for (const std::string& n : names) {
    const auto ia = a.find(n), ib = b.find(n);
    if (ia != a.end() && ib != b.end() && ia->second.value == ib->second.value &&
        ia->second.type == ib->second.type)
      continue;
    ++differ;
    if (ia == a.end() || ib == b.end()) {
      log::info("#   {}{}  only in {}: {}", prefix, n, ia == a.end() ? "B" : "A",
                shown(ia == a.end() ? ib->second : ia->second));
      continue;
    }
    const AttrText &x = ia->second, &y = ib->second;
    if (x.is_string && y.is_string && (x.value.find('\n') != std::string::npos ||
                                       y.value.find('\n') != std::string::npos)) {
      // Text of several lines (the resolved parameter file): the lines of
      // each that the other lacks.
      const std::vector<std::string> lx = lines_of(x.value), ly = lines_of(y.value);
      const std::multiset<std::string> sx(lx.begin(), lx.end()), sy(ly.begin(), ly.end());
      log::info("#   {}{}  differs ({} and {} lines):", prefix, n, lx.size(), ly.size());
      for (const std::string& l : lx)
        if (!sy.contains(l)) log::info("#       A: {}", log::printable(l, 200));
      for (const std::string& l : ly)
        if (!sx.contains(l)) log::info("#       B: {}", log::printable(l, 200));
      continue;
    }
    log::info("#   {}{}  A: {} ({})  B: {} ({})", prefix, n, shown(x), x.type, shown(y), y.type);
  }
  return differ;
}

}  // namespace

void diff(const DiffOptions& o) {
  h5::File fa = open_checkpoint(o.a), fb = open_checkpoint(o.b);
  const std::vector<std::string> la = io::ckpt::list_datasets(fa), lb = io::ckpt::list_datasets(fb);
  const std::set<std::string> sa(la.begin(), la.end()), sb(lb.begin(), lb.end());

  std::vector<DatasetInfo> both;
  std::vector<std::string> only_a, only_b, shapes, not_numbers;
  uint64_t total = 0;
  for (const std::string& p : la) {
    if (!sb.contains(p)) {
      only_a.push_back(p);
      continue;
    }
    const DatasetInfo x = dataset_info(fa, p), y = dataset_info(fb, p);
    if (x.shape != y.shape) {
      shapes.push_back(fmt::format("{}: {} in A, {} in B", p, shape_string(x.shape), shape_string(y.shape)));
    } else if (!x.numeric || !y.numeric) {
      not_numbers.push_back(fmt::format("{}: {} in A, {} in B", p, x.dtype, y.dtype));
    } else {
      total += 2 * x.numel;
      both.push_back(x);
    }
  }
  for (const std::string& p : lb)
    if (!sa.contains(p)) only_b.push_back(p);

  log::info("# diff A = {}", o.a);
  log::info("#      B = {}", o.b);
  log::info("# {} datasets compared, {} only in A, {} only in B, {} of different shapes",
            both.size(), only_a.size(), only_b.size(), shapes.size());
  log::info("# rel_diff = ||a - b|| / max(||a||, {:g}), max_abs = max |a - b|, over every value "
            "in double (nan: a NaN or Inf in one file that the other does not match)",
            kTinyNorm);

  ProgressBar bar("diff", static_cast<size_t>(total));
  uint64_t done = 0;
  std::vector<PairDiff> rows;
  for (const DatasetInfo& d : both) rows.push_back(compare(fa, fb, d, bar, done));
  bar.finish();
  std::sort(rows.begin(), rows.end(), larger);

  const size_t shown = o.top == 0 ? rows.size() : std::min(o.top, rows.size());
  Table t({"dataset", "shape", "rel_diff", "max_abs", "norm_a", "norm_b", "identical"});
  for (size_t i = 0; i < shown; ++i) {
    const PairDiff& p = rows[i];
    t.add({p.path, p.shape, num(p.rel, o.format), num(p.max_abs, o.format), num(p.norm_a, o.format),
           num(p.norm_b, o.format), p.identical ? "yes" : "no"});
  }
  t.print(o.format);
  const size_t same = static_cast<size_t>(std::count_if(rows.begin(), rows.end(),
                                                        [](const PairDiff& p) { return p.identical; }));
  if (shown < rows.size())
    log::info("# ... {} more datasets (--top 0 prints all)", rows.size() - shown);
  log::info("# {} of {} datasets identical", same, rows.size());

  for (const std::string& p : only_a) log::info("# only in A: {}", p);
  for (const std::string& p : only_b) log::info("# only in B: {}", p);
  for (const std::string& s : shapes) log::info("# shapes differ: {}", s);
  for (const std::string& s : not_numbers) log::info("# not compared, not numbers: {}", s);

  log::info("# attributes that differ (of / and /meta)");
  const size_t attrs = diff_attrs(fa, fb, "/") + diff_attrs(fa, fb, "meta");
  log::info("# {} attributes differ", attrs);
}

}  // namespace meshlm::ckpt_tools
