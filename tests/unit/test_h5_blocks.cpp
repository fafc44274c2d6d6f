// io/h5.h's block, type, walk and attribute helpers (the `meshlm ckpt`
// tools' access to HDF5), checked against values written and read with
// HDF5's C API directly.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "io/h5.h"
#include "scratch_dir.h"

using namespace meshlm;
namespace h5 = meshlm::io::h5;

using H5Blocks = ScratchDirTest;

TEST_F(H5Blocks, RowsWrittenInBlocksReadBackAsBlocks) {
  const hsize_t R = 7, C = 5;
  std::vector<float> all(R * C);
  for (size_t i = 0; i < all.size(); ++i) all[i] = float(i) * 0.5f - 3.0f;
  {
    h5::File f = h5::create_file(file("b.h5"));
    h5::Dataset d = h5::create_dataset(f, "m", H5T_IEEE_F32LE, {R, C});
    h5::write_rows(d, 0, 3, H5T_NATIVE_FLOAT, all.data());
    h5::write_rows(d, 3, 4, H5T_NATIVE_FLOAT, all.data() + 3 * C);
    h5::Dataset v = h5::create_dataset(f, "v", H5T_IEEE_F64LE, {R});
    std::vector<double> vec(R);
    for (hsize_t i = 0; i < R; ++i) vec[i] = double(i) + 0.25;
    h5::write_rows(v, 0, R, H5T_NATIVE_DOUBLE, vec.data());
  }
  // The whole matrix through the C API.
  hid_t f = H5Fopen(file("b.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "m", H5P_DEFAULT);
  std::vector<float> back(R * C);
  ASSERT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
  EXPECT_EQ(back, all);
  // Rows [2, 5) x columns [1, 4).
  std::vector<float> block(3 * 3);
  h5::read_block(d, 2, 3, 1, 3, H5T_NATIVE_FLOAT, block.data());
  for (hsize_t r = 0; r < 3; ++r)
    for (hsize_t c = 0; c < 3; ++c) EXPECT_EQ(block[r * 3 + c], all[(2 + r) * C + 1 + c]);
  const h5::TypeInfo t = h5::dataset_type(d);
  EXPECT_EQ(t.cls, h5::TypeInfo::Class::floating);
  EXPECT_EQ(t.bytes, 4u);
  H5Dclose(d);
  // A vector read as (n, 1).
  hid_t v = H5Dopen2(f, "v", H5P_DEFAULT);
  std::vector<double> part(3);
  h5::read_block(v, 4, 3, 0, 1, H5T_NATIVE_DOUBLE, part.data());
  EXPECT_EQ(part, (std::vector<double>{4.25, 5.25, 6.25}));
  H5Dclose(v);
  H5Fclose(f);
}

TEST_F(H5Blocks, ObjectsAndAttributesOfAnyType) {
  {
    h5::File f = h5::create_file(file("a.h5"));
    h5::Group g = h5::require_group(f, "meta/checksums");
    h5::write_string_attr(f, "kind", "x");
    const int64_t ints[3] = {-1, 2, 3};
    const hsize_t n = 3;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(f, "ints", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, ints);
    H5Aclose(a);
    H5Sclose(space);
    h5::write_scalar_attr<uint64_t>(f, "sum", 0xfedcba9876543210ull);
    h5::write_scalar_attr<double>(f, "alpha", 0.5);
    h5::write_dataset(f, "meta/d", std::vector<float>{1, 2});
  }
  h5::File f = h5::open_file(file("a.h5"));
  EXPECT_EQ(h5::attr_names(f), (std::vector<std::string>{"alpha", "ints", "kind", "sum"}));
  const h5::AttrInfo ints = h5::attr_info(f, "ints");
  EXPECT_EQ(ints.count, 3u);
  EXPECT_EQ(ints.type.cls, h5::TypeInfo::Class::integer);
  EXPECT_FALSE(ints.type.is_unsigned);
  EXPECT_EQ(h5::read_attr_values<int64_t>(f, "ints"), (std::vector<int64_t>{-1, 2, 3}));
  const h5::AttrInfo sum = h5::attr_info(f, "sum");
  EXPECT_TRUE(sum.type.is_unsigned);
  EXPECT_EQ(h5::read_attr_values<uint64_t>(f, "sum"),
            (std::vector<uint64_t>{0xfedcba9876543210ull}));
  EXPECT_EQ(h5::attr_info(f, "kind").type.cls, h5::TypeInfo::Class::string);
  EXPECT_EQ(h5::read_attr_values<double>(f, "alpha"), (std::vector<double>{0.5}));
  const std::vector<h5::ObjectInfo> objs = h5::walk_objects(f);
  ASSERT_EQ(objs.size(), 4u);
  EXPECT_EQ(objs[0].path, "");
  EXPECT_EQ(objs[0].num_attrs, 4u);
  EXPECT_EQ(objs[1].path, "meta");
  EXPECT_EQ(objs[2].path, "meta/checksums");
  EXPECT_TRUE(objs[2].is_group);
  EXPECT_EQ(objs[3].path, "meta/d");
  EXPECT_FALSE(objs[3].is_group);
}
