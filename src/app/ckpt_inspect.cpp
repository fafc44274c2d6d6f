// meshlm ckpt inspect FILE [--config]
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "app/ckpt_tools.h"
#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint_file.h"
#include "train/report.h"

namespace meshlm::ckpt_tools {

namespace h5 = io::h5;

namespace {

size_t count_lines(const std::string& s) {
  if (s.empty()) return 0;
  size_t n = static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
  return s.back() == '\n' ? n : n + 1;
}

void print_attrs(hid_t obj, const std::string& where, bool show_config,
                 std::vector<std::pair<std::string, std::string>>& configs) {
  const std::vector<AttrText> attrs = read_attrs(obj);
  log::info("# attributes of {} ({})", where, attrs.size());
  size_t wn = 4, wt = 4;
  for (const AttrText& a : attrs) {
    wn = std::max(wn, a.name.size());
    wt = std::max(wt, a.type.size());
  }
  log::info("# {:<{}}  {:<{}}  {}", "name", wn, "type", wt, "value");
  for (const AttrText& a : attrs) {
    std::string value = a.value;
    if (a.is_string && a.name == "config") {
      configs.emplace_back(where, a.value);
      value = fmt::format("({} lines, {} bytes{})", count_lines(a.value), a.value.size(),
                          show_config ? "; printed below" : "; --config prints it");
    } else if (a.is_string) {
      value = fmt::format("'{}'", log::printable(a.value, 1024));
    }
    log::info("  {:<{}}  {:<{}}  {}", a.name, wn, a.type, wt, value);
  }
}

}  // namespace

void inspect(const InspectOptions& o) {
  h5::File file = open_checkpoint(o.file);
  std::error_code ec;
  const auto disk = std::filesystem::file_size(o.file, ec);
  const bool is_ckpt = io::ckpt::is_checkpoint_file(o.file);
  log::info("# inspect {}: {} on disk; {}", o.file,
            ec ? std::string("?") : format_bytes(static_cast<double>(disk)),
            is_ckpt ? "a meshlm checkpoint"
                    : fmt::format("not a meshlm checkpoint (no /meta attribute kind = '{}')",
                                  io::ckpt::kKind));

  // /meta/checksums, read once, for the column that says whether each
  // dataset's own attribute agrees with it (verify recomputes both).
  h5::Group sums;
  if (h5::exists(file, io::ckpt::kChecksumGroup))
    sums = h5::open_group(file, io::ckpt::kChecksumGroup);

  struct Total {
    uint64_t datasets = 0, elements = 0, bytes = 0;
  };
  std::map<std::string, Total> totals;  // by top-level group
  Total all;
  Table tree({"object", "kind", "shape", "dtype", "bytes", "attrs", "xxh3", "meta/checksums"});
  for (const h5::ObjectInfo& obj : h5::walk_objects(file)) {
    if (obj.is_group) {
      tree.add({obj.path.empty() ? "/" : obj.path + "/", "group", "-", "-", "-",
                std::to_string(obj.num_attrs), "-", "-"});
      continue;
    }
    const DatasetInfo d = dataset_info(file, obj.path);
    std::string xxh3 = "-", meta = "-";
    h5::Dataset dset = h5::open_dataset(file, obj.path);
    std::optional<uint64_t> own;
    if (h5::has_attr(dset, io::ckpt::kChecksumAttr)) {
      own = h5::read_scalar_attr<uint64_t>(dset, io::ckpt::kChecksumAttr);
      xxh3 = hex64(*own);
    }
    if (sums.valid()) {
      if (!h5::has_attr(sums, obj.path)) meta = "missing";
      else if (!own) meta = "meta-only";
      else meta = h5::read_scalar_attr<uint64_t>(sums, obj.path) == *own ? "same" : "DIFFERS";
    }
    tree.add({obj.path, "dataset", shape_string(d.shape), d.dtype, std::to_string(d.bytes()),
              std::to_string(obj.num_attrs), xxh3, meta});
    const std::string top = obj.path.substr(0, obj.path.find('/'));
    for (Total* t : {&totals[top], &all}) {
      t->datasets += 1;
      t->elements += d.numel;
      t->bytes += d.bytes();
    }
  }
  tree.print(Format::table);

  log::info("# totals");
  Table tt({"group", "datasets", "elements", "bytes", "size"});
  for (const auto& [name, t] : totals)
    tt.add({name, std::to_string(t.datasets), std::to_string(t.elements), std::to_string(t.bytes),
            format_bytes(static_cast<double>(t.bytes))});
  tt.add({"all", std::to_string(all.datasets), std::to_string(all.elements),
          std::to_string(all.bytes), format_bytes(static_cast<double>(all.bytes))});
  tt.print(Format::table);

  std::vector<std::pair<std::string, std::string>> configs;
  print_attrs(file, "/", o.show_config, configs);
  if (h5::exists(file, "meta")) {
    h5::Group meta = h5::open_group(file, "meta");
    print_attrs(meta, "/meta", o.show_config, configs);
  }
  if (o.show_config) {
    for (const auto& [where, text] : configs) {
      log::info("# config (attribute of {}, {} lines):", where, count_lines(text));
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) log::info("{}", line);
    }
  }
}

}  // namespace meshlm::ckpt_tools
