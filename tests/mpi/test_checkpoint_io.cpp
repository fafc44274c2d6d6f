// io/checkpoint_file's writes and hashes, on 4 ranks:
//  * write_boxes_in_blocks, independent: each rank writes a range of a
//    tensor's elements (partial rows at both ends) or of its rows, larger
//    than one write block and fetched a block at a time, with ranks that
//    write nothing; collective: the
//    strided column parts of tensor parallelism. The file, read with serial
//    HDF5, holds every element where it belongs;
//  * independent boxes out of the file's order, or not contiguous, are an
//    error, not a wrong file;
//  * dataset_checksum: the stored bytes' hash (contiguous little-endian
//    float32) equals XXH3-64 of the floats in memory, in a file with a user
//    block too; a chunked and a big-endian dataset (read and converted by
//    HDF5) hash to the same value as their logical content.
// meshlm-test-ranks: 4
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/h5.h"

using namespace meshlm;
namespace ck = meshlm::io::ckpt;
namespace h5 = meshlm::io::h5;
namespace fs = std::filesystem;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// A directory every rank names the same, made by rank 0.
fs::path shared_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("meshlm_ckio_" + name);
  if (world_rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

float value_at(uint64_t i) { return static_cast<float>(i % 100003) * 0.5f - 7.0f; }

// The boxes of the elements [a, b) of a (rows, cols) tensor: a partial first
// row, whole rows, a partial last row.
std::vector<ck::Box> element_range(hsize_t cols, hsize_t a, hsize_t b) {
  std::vector<ck::Box> out;
  while (a < b) {
    const hsize_t r = a / cols, c = a % cols;
    if (c != 0 || b - a < cols) {
      const hsize_t n = std::min(cols - c, b - a);
      out.push_back({{r, c}, {1, n}});
      a += n;
    } else {
      const hsize_t rows = (b - a) / cols;
      out.push_back({{r, 0}, {rows, cols}});
      a += rows * cols;
    }
  }
  return out;
}

std::vector<float> read_all(const std::string& path, const std::string& name) {
  h5::File f = h5::open_file(path);
  h5::Dataset d = h5::open_dataset(f, name);
  std::vector<hsize_t> dims = h5::shape(d);
  size_t n = 1;
  for (hsize_t x : dims) n *= static_cast<size_t>(x);
  std::vector<float> out(n);
  h5::check(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), d, name,
            "read");
  return out;
}

}  // namespace

TEST(CheckpointIo, IndependentAndCollectiveWritesPutEveryElementInPlace) {
  const int rank = world_rank(), size = world_size();
  const fs::path dir = shared_dir("writes");
  const std::string path = (dir / "t.h5").string();
  // 1500 x 1024 floats (6 MiB). "flat": ranks 0..size-2 each write an
  // uneven element range, the last rank nothing; "big" (5000 rows, 20 MiB):
  // rank 0 all of it, in blocks; "cols": each rank a band of columns
  // (strided), collectively.
  const hsize_t R = 1500, C = 1024, bigR = 5000;
  h5::File f = ck::create_parallel(path, MPI_COMM_WORLD);
  {
    h5::Dataset flat = ck::create_tensor(f, "flat", {R, C});
    const hsize_t n = R * C, writers = static_cast<hsize_t>(size - 1);
    // Uneven cuts, none on a row boundary.
    auto cut = [&](hsize_t k) { return k == writers ? n : k * n / writers + 37 * k; };
    std::vector<ck::Box> boxes;
    std::vector<float> data;
    if (static_cast<hsize_t>(rank) < writers) {
      const hsize_t a = cut(static_cast<hsize_t>(rank)), b = cut(static_cast<hsize_t>(rank) + 1);
      boxes = element_range(C, a, b);
      for (hsize_t i = a; i < b; ++i) data.push_back(value_at(i));
    }
    ck::write_boxes_in_blocks(flat, boxes, data.data(), {}, /*collective=*/false);

    h5::Dataset big = ck::create_tensor(f, "big", {bigR, C});
    // Rank 0 holds all of it, the others nothing: more than one block.
    const hsize_t lo = rank == 0 ? 0 : bigR, hi = bigR;
    std::vector<float> bigdata;
    for (hsize_t i = lo * C; i < hi * C; ++i) bigdata.push_back(value_at(i));
    std::vector<ck::Box> bigboxes;
    if (hi > lo) bigboxes.push_back({{lo, 0}, {hi - lo, C}});
    int blocks = 0;
    size_t fetched = 0, largest = 0;
    ck::write_boxes_in_blocks(
        big, bigboxes,
        [&](size_t offset, size_t n) {
          EXPECT_EQ(offset, fetched);  // in order, each element once
          fetched += n;
          largest = std::max(largest, n);
          return bigdata.data() + offset;
        },
        [&] { ++blocks; }, false);
    EXPECT_EQ(fetched, bigdata.size());
    EXPECT_LE(largest * sizeof(float), ck::kWriteBlockBytes);  // a device stages a block
    if (rank == 0) EXPECT_EQ(blocks, 2);  // 20 MiB in blocks of 16
    else EXPECT_EQ(blocks, 0);            // no boxes, no call

    h5::Dataset cols = ck::create_tensor(f, "cols", {R, C});
    const hsize_t c0 = C * static_cast<hsize_t>(rank) / static_cast<hsize_t>(size),
                  c1 = C * static_cast<hsize_t>(rank + 1) / static_cast<hsize_t>(size);
    std::vector<float> band;
    for (hsize_t r = 0; r < R; ++r)
      for (hsize_t c = c0; c < c1; ++c) band.push_back(value_at(r * C + c));
    ck::write_boxes_in_blocks(cols, {{{0, c0}, {R, c1 - c0}}}, band.data(), {}, true);
  }
  h5::close_file(f, path);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    for (const char* name : {"flat", "cols", "big"}) {
      const std::vector<float> got = read_all(path, name);
      size_t wrong = 0, first = got.size();
      for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != value_at(i)) {
          ++wrong;
          first = std::min(first, i);
        }
      EXPECT_EQ(wrong, 0u) << name << ": first wrong element " << first;
      h5::File f = h5::open_file(path);
      h5::Dataset d = h5::open_dataset(f, name);
      std::vector<float> want(got.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = value_at(i);
      EXPECT_EQ(ck::dataset_checksum(d), ck::float_checksum(want.data(), want.size())) << name;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

TEST(CheckpointIo, IndependentBoxesOutOfOrderOrStridedAreAnError) {
  const int rank = world_rank();
  const fs::path dir = shared_dir("order");
  const std::string path = (dir / "t.h5").string();
  h5::File f = ck::create_parallel(path, MPI_COMM_WORLD);
  {
    h5::Dataset d = ck::create_tensor(f, "x", {8, 16});
    std::vector<float> data(64, 1.0f);
    if (rank == 0) {
    // Rows 4..5 before rows 0..1.
    EXPECT_THROW(ck::write_boxes_in_blocks(d, {{{4, 0}, {2, 16}}, {{0, 0}, {2, 16}}}, data.data(),
                                           {}, false),
                 Error);
    // A band of columns over two rows: not one range of the file.
    EXPECT_THROW(ck::write_boxes_in_blocks(d, {{{0, 0}, {2, 8}}}, data.data(), {}, false), Error);
    }
  }
  h5::close_file(f, path);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
}

TEST(CheckpointIo, StoredBytesHashLikeTheLogicalContent) {
  if (world_rank() != 0) return;
  const fs::path dir = fs::temp_directory_path() / "meshlm_ckio_hash";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const hsize_t dims[2] = {300, 77};
  std::vector<float> x(300 * 77);
  for (size_t i = 0; i < x.size(); ++i) x[i] = value_at(i * 7);
  const uint64_t want = ck::float_checksum(x.data(), x.size());
  struct Case {
    const char* what;
    hsize_t userblock;
    bool chunked;
    hid_t type;
  };
  for (const Case& c : {Case{"contiguous", 0, false, H5T_IEEE_F32LE},
                        Case{"user block of 1024 bytes", 1024, false, H5T_IEEE_F32LE},
                        Case{"chunked", 0, true, H5T_IEEE_F32LE},
                        Case{"big-endian", 512, false, H5T_IEEE_F32BE}}) {
    SCOPED_TRACE(c.what);
    const std::string path = (dir / "h.h5").string();
    {
      h5::PropList fcpl(H5Pcreate(H5P_FILE_CREATE));
      if (c.userblock) H5Pset_userblock(fcpl, c.userblock);
      h5::File f = h5::create_file(path, H5P_DEFAULT, fcpl);
      h5::Dataspace space(H5Screate_simple(2, dims, nullptr));
      h5::PropList dcpl(H5Pcreate(H5P_DATASET_CREATE));
      if (c.chunked) {
        const hsize_t chunk[2] = {64, 77};
        H5Pset_chunk(dcpl, 2, chunk);
      }
      h5::Dataset d(H5Dcreate2(f, "x", c.type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
      ASSERT_TRUE(d.valid());
      ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()), 0);
    }
    h5::File f = h5::open_file(path);
    h5::Dataset d = h5::open_dataset(f, "x");
    uint64_t last = 0;
    EXPECT_EQ(ck::dataset_checksum(d, H5P_DEFAULT, [&](uint64_t done, uint64_t total) {
                EXPECT_EQ(total, x.size());
                EXPECT_GT(done, last);
                last = done;
              }),
              want);
    EXPECT_EQ(last, x.size());
  }
  fs::remove_all(dir);
}
