#include "loader/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace osprey {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/osprey_mapped_" + name; }

TEST(MappedFile, MapsContents) {
  const std::string path = temp_path("data.bin");
  { std::ofstream(path, std::ios::binary) << "hello mapping"; }
  auto r = MappedFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->size(), 13u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*r)->data()), (*r)->size()), "hello mapping");
  EXPECT_EQ((*r)->path(), path);
  std::remove(path.c_str());
}

TEST(MappedFile, EmptyFile) {
  const std::string path = temp_path("empty.bin");
  { std::ofstream out(path, std::ios::binary); }
  auto r = MappedFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->size(), 0u);
  EXPECT_NE((*r)->data(), nullptr);
  std::remove(path.c_str());
}

TEST(MappedFile, Errors) {
  auto missing = MappedFile::open("/nonexistent/osprey/file");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/osprey/file"), std::string::npos);
  auto dir = MappedFile::open(::testing::TempDir());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("not a regular file"), std::string::npos) << dir.status().message();
}

}  // namespace
}  // namespace osprey
