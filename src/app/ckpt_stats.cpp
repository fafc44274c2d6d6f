// meshlm ckpt stats FILE [--layers] [--format table|tsv]
//
// Statistics in double over the finite values of each dataset, a block of
// rows at a time (BlockReader): each block's count, mean and sum of squared
// deviations (two passes over the block in memory) are merged into the
// running ones with the pairwise update of Chan, Golub and LeVeque,
//   n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d nb / n,
//   M2 = M2a + M2b + d^2 na nb / n,
// which keeps std exact to rounding where the one-pass sum of squares would
// cancel (a tensor of mean 1e3 and std 1e-3). std = sqrt(M2 / n) (the
// population's, numpy's default); L2 = sqrt(sum x^2).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <span>

#include "app/ckpt_tools.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/checkpoint_file.h"

namespace meshlm::ckpt_tools {

namespace h5 = io::h5;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Moments {
  uint64_t numel = 0, n = 0, nan = 0, inf = 0;  // n: finite values
  double mean = 0, m2 = 0, sumsq = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();

  void merge(const Moments& o) {
    numel += o.numel;
    nan += o.nan;
    inf += o.inf;
    sumsq += o.sumsq;
    min = std::min(min, o.min);
    max = std::max(max, o.max);
    if (o.n == 0) return;
    const double na = static_cast<double>(n), nb = static_cast<double>(o.n), nt = na + nb;
    const double d = o.mean - mean;
    mean += d * nb / nt;
    m2 += o.m2 + d * d * na * nb / nt;
    n += o.n;
  }

  void add_block(std::span<const double> x) {
    Moments b;
    b.numel = x.size();
    double sum = 0;
    for (double v : x) {
      if (std::isnan(v)) {
        ++b.nan;
      } else if (std::isinf(v)) {
        ++b.inf;
      } else {
        ++b.n;
        sum += v;
        b.sumsq += v * v;
        b.min = std::min(b.min, v);
        b.max = std::max(b.max, v);
      }
    }
    if (b.n > 0) {
      b.mean = sum / static_cast<double>(b.n);
      for (double v : x)
        if (std::isfinite(v)) b.m2 += (v - b.mean) * (v - b.mean);
    }
    merge(b);
  }

  std::vector<std::string> cells(Format f) const {
    const bool any = n > 0;
    return {std::to_string(numel),
            num(any ? min : kNaN, f),
            num(any ? max : kNaN, f),
            num(any ? mean : kNaN, f),
            num(any ? std::sqrt(m2 / static_cast<double>(n)) : kNaN, f),
            num(std::sqrt(sumsq), f),
            std::to_string(nan),
            std::to_string(inf)};
  }
};

// The set and the layer of a dataset, for --layers:
//   params/h.3.mlp.c_fc.weight            -> params,       h.3
//   optimizer/wte.weight/m                -> optimizer/m,  embeddings
//   lora/h.0.attn.c_attn.weight/A         -> lora/A,       h.0
struct Group {
  std::string set, layer;
};

Group group_of(const std::string& path) {
  const size_t first = path.find('/');
  if (first == std::string::npos) return {path, path};
  std::string set = path.substr(0, first), name = path.substr(first + 1);
  if ((set == "optimizer" || set == "lora") && name.find('/') != std::string::npos) {
    const size_t last = name.rfind('/');
    set = fmt::format("{}/{}", set, name.substr(last + 1));
    name = name.substr(0, last);
  }
  if (name.starts_with("h.")) {
    const size_t dot = name.find('.', 2);
    // At most 9 digits: a layer index, whatever a foreign file names.
    if (dot != std::string::npos && dot > 2 && dot <= 11 &&
        std::all_of(name.begin() + 2, name.begin() + static_cast<ptrdiff_t>(dot),
                    [](unsigned char c) { return std::isdigit(c) != 0; }))
      return {set, name.substr(0, dot)};
  }
  if (name.starts_with("wte.") || name.starts_with("wpe.")) return {set, "embeddings"};
  return {set, name.substr(0, name.find('.'))};
}

// embeddings, h.0, h.1, ..., h.10, ..., ln_f, then anything else by name.
std::pair<int64_t, std::string> layer_order(const std::string& layer) {
  if (layer == "embeddings") return {-1, ""};
  if (layer.starts_with("h.")) return {std::stoll(layer.substr(2)), ""};
  if (layer == "ln_f") return {std::numeric_limits<int64_t>::max() - 1, ""};
  return {std::numeric_limits<int64_t>::max(), layer};
}

const std::vector<std::string> kColumns = {"numel", "min", "max", "mean", "std", "l2", "nan", "inf"};

}  // namespace

void stats(const StatsOptions& o) {
  h5::File file = open_checkpoint(o.file);
  std::vector<DatasetInfo> sets;
  std::vector<std::string> skipped;
  uint64_t total = 0;
  for (const std::string& path : io::ckpt::list_datasets(file)) {
    DatasetInfo d = dataset_info(file, path);
    if (!d.numeric) {
      skipped.push_back(path + " (" + d.dtype + ")");
      continue;
    }
    total += d.numel;
    sets.push_back(std::move(d));
  }
  log::info("# stats {}: {} datasets, {} values; over the finite values in double: "
            "std = sqrt(sum (x - mean)^2 / n), l2 = sqrt(sum x^2); nan, inf: counts",
            o.file, sets.size(), total);

  std::vector<std::string> header = {"dataset", "shape"};
  header.insert(header.end(), kColumns.begin(), kColumns.end());
  Table per_tensor(header);
  std::vector<std::pair<Group, Moments>> groups;
  std::map<std::pair<std::string, std::string>, size_t> group_index;
  std::vector<size_t> group_tensors;

  ProgressBar bar("stats", static_cast<size_t>(total));
  uint64_t done = 0;
  for (const DatasetInfo& d : sets) {
    h5::Dataset dset = h5::open_dataset(file, d.path);
    BlockReader reader(dset);
    Moments m;
    for (std::span<const double> block = reader.next(); !block.empty(); block = reader.next()) {
      m.add_block(block);
      done += block.size();
      bar.update(static_cast<size_t>(done), d.path);
    }
    std::vector<std::string> row = {d.path, shape_string(d.shape)};
    const std::vector<std::string> cells = m.cells(o.format);
    row.insert(row.end(), cells.begin(), cells.end());
    per_tensor.add(std::move(row));

    const Group g = group_of(d.path);
    auto [it, fresh] = group_index.try_emplace({g.set, g.layer}, groups.size());
    if (fresh) {
      groups.push_back({g, Moments{}});
      group_tensors.push_back(0);
    }
    groups[it->second].second.merge(m);
    group_tensors[it->second] += 1;
  }
  bar.finish();
  log::info("# per dataset");
  per_tensor.print(o.format);
  for (const std::string& s : skipped) log::info("# skipped, not numbers: {}", s);

  if (!o.layers) return;
  // Sets in the order they first appear, layers in model order within a set.
  std::map<std::string, size_t> set_rank;
  for (const auto& [g, m] : groups) set_rank.try_emplace(g.set, set_rank.size());
  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Group &ga = groups[a].first, &gb = groups[b].first;
    return std::make_pair(set_rank[ga.set], layer_order(ga.layer)) <
           std::make_pair(set_rank[gb.set], layer_order(gb.layer));
  });
  std::vector<std::string> lheader = {"set", "layer", "tensors"};
  lheader.insert(lheader.end(), kColumns.begin(), kColumns.end());
  Table per_layer(lheader);
  for (size_t i : order) {
    std::vector<std::string> row = {groups[i].first.set, groups[i].first.layer,
                                    std::to_string(group_tensors[i])};
    const std::vector<std::string> cells = groups[i].second.cells(o.format);
    row.insert(row.end(), cells.begin(), cells.end());
    per_layer.add(std::move(row));
  }
  log::info("# per layer (tensors of h.<l>. together; wte and wpe as embeddings)");
  per_layer.print(o.format);
}

}  // namespace meshlm::ckpt_tools
