#include "app/ckpt_read.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint_file.h"

namespace meshlm::ckpt_tools {

namespace h5 = io::h5;

// ---------------------------------------------------------------------------
// Files and datasets
// ---------------------------------------------------------------------------

h5::File open_checkpoint(const std::string& path) {
  // open_file names the file in every error: missing, not HDF5, and HDF5's
  // own reason when the superblock cannot be read or the file is shorter
  // than its superblock says (a truncated copy).
  return h5::open_file(path);
}

DatasetInfo dataset_info(hid_t file, const std::string& path) {
  DatasetInfo info;
  info.path = path;
  h5::Dataset dset = h5::open_dataset(file, path);
  info.shape = h5::shape(dset);
  const h5::TypeInfo type = h5::dataset_type(dset);
  info.dtype = type.name;
  info.numeric = type.cls == h5::TypeInfo::Class::integer || type.cls == h5::TypeInfo::Class::floating;
  info.type_bytes = type.bytes;
  for (hsize_t d : info.shape) info.numel *= d;
  return info;
}

std::string shape_string(const std::vector<hsize_t>& shape) {
  if (shape.empty()) return "scalar";
  return fmt::format("{}", fmt::join(shape, "x"));
}

BlockReader::BlockReader(hid_t dset) : dset_(dset), shape_(h5::shape(dset)) {
  const h5::TypeInfo type = h5::dataset_type(dset);
  if (type.cls != h5::TypeInfo::Class::integer && type.cls != h5::TypeInfo::Class::floating)
    h5::fail(dset, h5::object_name(dset), "is " + type.name + ", not numbers");
  is_float32_ = type.cls == h5::TypeInfo::Class::floating && type.bytes == sizeof(float);
  rows_ = shape_.empty() ? 1 : shape_[0];
  for (size_t d = 1; d < shape_.size(); ++d) row_ *= shape_[d];
  total_ = rows_ * row_;
  // The same rows per block as io::ckpt::dataset_checksum: a block of at most
  // kReadBlockBytes of float32, or one row.
  const hsize_t fit = io::ckpt::kReadBlockBytes / sizeof(float) / std::max<hsize_t>(row_, 1);
  per_block_ = std::max<hsize_t>(1, std::min<hsize_t>(rows_, fit));
  if (total_ > 0) {
    dbuf_.resize(static_cast<size_t>(per_block_ * row_));
    if (is_float32_) fbuf_.resize(dbuf_.size());
  }
}

std::span<const double> BlockReader::next() {
  if (total_ == 0 || next_row_ >= rows_) return {};
  const hsize_t n = std::min(per_block_, rows_ - next_row_);
  const size_t len = static_cast<size_t>(n * row_);
  if (shape_.empty()) {
    if (is_float32_) h5::read_all(dset_, H5T_NATIVE_FLOAT, fbuf_.data());
    else h5::read_all(dset_, H5T_NATIVE_DOUBLE, dbuf_.data());
  } else if (is_float32_) {
    h5::read_rows(dset_, next_row_, n, H5T_NATIVE_FLOAT, fbuf_.data());
  } else {
    h5::read_rows(dset_, next_row_, n, H5T_NATIVE_DOUBLE, dbuf_.data());
  }
  if (is_float32_) std::copy(fbuf_.begin(), fbuf_.begin() + static_cast<ptrdiff_t>(len), dbuf_.begin());
  next_row_ += n;
  return {dbuf_.data(), len};
}

// ---------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------

namespace {

// At most this many values of an array attribute are shown.
constexpr size_t kShownValues = 8;

template <typename T>
std::string values_text(hid_t obj, const std::string& name) {
  const std::vector<T> v = h5::read_attr_values<T>(obj, name);
  if (v.empty()) return "[]";
  if (v.size() == 1) return fmt::format("{}", v[0]);
  const size_t shown = std::min(v.size(), kShownValues);
  std::string s = fmt::format("[{}", fmt::join(v.begin(), v.begin() + static_cast<ptrdiff_t>(shown), ", "));
  return s + (shown < v.size() ? fmt::format(", ... ({} values)]", v.size()) : "]");
}

}  // namespace

std::vector<AttrText> read_attrs(hid_t obj) {
  std::vector<AttrText> out;
  for (const std::string& name : h5::attr_names(obj)) {
    const h5::AttrInfo info = h5::attr_info(obj, name);
    const size_t n = info.count;
    AttrText a;
    a.name = name;
    a.type = info.type.name + (n == 1 ? "" : fmt::format("[{}]", n));
    switch (info.type.cls) {
      case h5::TypeInfo::Class::string:
        a.is_string = true;
        a.value = n == 1 ? h5::read_string_attr(obj, name) : fmt::format("({} strings)", n);
        break;
      case h5::TypeInfo::Class::integer:
        a.value = info.type.is_unsigned ? values_text<uint64_t>(obj, name)
                                        : values_text<int64_t>(obj, name);
        break;
      case h5::TypeInfo::Class::floating: a.value = values_text<double>(obj, name); break;
      case h5::TypeInfo::Class::other: a.value = "-"; break;
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

std::string num(double v, Format f) {
  return f == Format::tsv ? fmt::format("{:.17g}", v) : fmt::format("{:.6g}", v);
}

void Table::print(Format f) const {
  if (f == Format::tsv) {
    log::info("# {}", fmt::join(header_, "\t"));
    for (const auto& row : rows_) log::info("{}", fmt::join(row, "\t"));
    return;
  }
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  widen(header_);
  for (const auto& row : rows_) widen(row);
  auto line = [&](const char* lead, const std::vector<std::string>& row) {
    std::string s = lead;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t w = c < width.size() ? width[c] : 0;
      s += c == 0 ? fmt::format("{:<{}}", row[c], w) : fmt::format("  {:>{}}", row[c], w);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  log::info("{}", line("# ", header_));
  for (const auto& row : rows_) log::info("{}", line("  ", row));
}

}  // namespace meshlm::ckpt_tools
