// meshlm ckpt verify FILE
//
// Recomputes every dataset's XXH3-64 with io::ckpt::dataset_checksum (the
// writer's own function, a block of rows at a time) and compares it with
// both stored copies: the dataset's xxh3 attribute and /meta/checksums'
// attribute of the same path. Every dataset is checked and printed; the
// problems are listed after the table, and the first one, with the file's
// name, is the error (exit status 1 on every rank).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <set>

#include "app/ckpt_tools.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/checkpoint_file.h"
#include "train/report.h"

namespace meshlm::ckpt_tools {

namespace h5 = io::h5;

namespace {

// /meta's kind and format_version, and the root's format_version.
void check_meta(hid_t file, std::vector<std::string>& problems) {
  if (!h5::exists(file, "meta")) {
    problems.push_back("no /meta group: not a meshlm checkpoint");
    return;
  }
  h5::Group meta = h5::open_group(file, "meta");
  if (!h5::has_attr(meta, "kind")) {
    problems.push_back(fmt::format("/meta has no attribute kind (expected '{}')", io::ckpt::kKind));
  } else {
    try {
      const std::string kind = h5::read_string_attr(meta, "kind");
      if (kind != io::ckpt::kKind)
        problems.push_back(fmt::format("/meta kind is '{}', not '{}'", log::printable(kind),
                                       io::ckpt::kKind));
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("/meta kind: {}", e.what()));
    }
  }
  auto version = [&](hid_t obj, const std::string& where) {
    if (!h5::has_attr(obj, "format_version")) {
      problems.push_back(where + " has no attribute format_version");
      return;
    }
    try {
      const int64_t v = h5::read_scalar_attr<int64_t>(obj, "format_version");
      if (v != io::ckpt::kFormatVersion)
        problems.push_back(fmt::format("{} format_version is {}; this meshlm reads format_version {}",
                                       where, v, io::ckpt::kFormatVersion));
    } catch (const std::exception& e) {
      problems.push_back(fmt::format("{} format_version: {}", where, e.what()));
    }
  };
  version(meta, "/meta");
  version(file, "/");
}

}  // namespace

void verify(const VerifyOptions& o) {
  h5::File file = open_checkpoint(o.file);
  std::vector<std::string> problems;
  check_meta(file, problems);

  h5::Group sums;
  if (h5::exists(file, io::ckpt::kChecksumGroup))
    sums = h5::open_group(file, io::ckpt::kChecksumGroup);
  else
    problems.push_back(fmt::format("no /{} group", io::ckpt::kChecksumGroup));

  const std::vector<std::string> paths = io::ckpt::list_datasets(file);
  if (paths.empty()) problems.push_back("no datasets");
  std::vector<DatasetInfo> infos;
  uint64_t total = 0;
  for (const std::string& p : paths) {
    infos.push_back(dataset_info(file, p));
    total += infos.back().bytes();
  }
  log::info("# verify {}: {} datasets, {} ({} bytes); XXH3-64 of each against its {} attribute "
            "and /{}",
            o.file, paths.size(), format_bytes(static_cast<double>(total)), total,
            io::ckpt::kChecksumAttr, io::ckpt::kChecksumGroup);

  ProgressBar bar("verify", static_cast<size_t>(total));
  uint64_t done = 0;
  Table t({"dataset", "shape", "computed", "xxh3", "meta/checksums", "status"});
  for (const DatasetInfo& d : infos) {
    std::string computed = "-", own = "-", meta = "-";
    std::vector<std::string> issues;  // of this dataset, one problem in all
    try {
      h5::Dataset dset = h5::open_dataset(file, d.path);
      std::optional<uint64_t> stored_own, stored_meta;
      if (h5::has_attr(dset, io::ckpt::kChecksumAttr)) {
        stored_own = h5::read_scalar_attr<uint64_t>(dset, io::ckpt::kChecksumAttr);
        own = hex64(*stored_own);
      }
      if (sums.valid() && h5::has_attr(sums, d.path)) {
        stored_meta = h5::read_scalar_attr<uint64_t>(sums, d.path);
        meta = hex64(*stored_meta);
      }
      const uint64_t base = done;
      const uint64_t c = io::ckpt::dataset_checksum(dset, H5P_DEFAULT, [&](uint64_t n, uint64_t) {
        bar.update(static_cast<size_t>(base + n * d.type_bytes), d.path);
      });
      computed = hex64(c);
      if (!stored_own)
        issues.push_back(fmt::format("no {} attribute (computed {})", io::ckpt::kChecksumAttr, computed));
      else if (*stored_own != c)
        issues.push_back(fmt::format("checksum mismatch (stored {}, computed {})", own, computed));
      // /meta/checksums said once when it repeats the attribute's wrong value.
      if (sums.valid() && !stored_meta)
        issues.push_back(fmt::format("no entry in /{} (computed {})", io::ckpt::kChecksumGroup, computed));
      else if (stored_meta && *stored_meta != c && stored_meta != stored_own)
        issues.push_back(fmt::format("/{} mismatch (stored {}, computed {})",
                                     io::ckpt::kChecksumGroup, meta, computed));
    } catch (const std::exception& e) {
      // An unreadable dataset (a truncated or damaged file, a type that is
      // not float32) is a problem of this dataset; the others are still checked.
      issues.push_back(e.what());
    }
    if (!issues.empty()) problems.push_back(fmt::format("{}: {}", d.path, fmt::join(issues, "; ")));
    t.add({d.path, shape_string(d.shape), computed, own, meta, issues.empty() ? "ok" : "BAD"});
    done += d.bytes();
  }
  bar.finish();
  t.print(Format::table);

  // Entries of /meta/checksums whose dataset is missing (a tensor dropped).
  if (sums.valid()) {
    const std::set<std::string> present(paths.begin(), paths.end());
    for (const AttrText& a : read_attrs(sums))
      if (!present.contains(a.name))
        problems.push_back(fmt::format("{}: listed in /{}, but there is no such dataset", a.name,
                                       io::ckpt::kChecksumGroup));
  }

  if (problems.empty()) {
    log::info("# verify {}: OK, {} datasets, every checksum matches both stored copies; "
              "format_version {}, kind '{}'",
              o.file, paths.size(), io::ckpt::kFormatVersion, io::ckpt::kKind);
    return;
  }
  log::info("# verify {}: {} problem(s)", o.file, problems.size());
  for (const std::string& p : problems) log::info("#   {}", p);
  throw RankError(fmt::format("{}: {}{}", o.file, problems.front(),
                              problems.size() > 1
                                  ? fmt::format(" (and {} more problem(s), listed above)", problems.size() - 1)
                                  : ""),
                  MESHLM_HERE);
}

}  // namespace meshlm::ckpt_tools
