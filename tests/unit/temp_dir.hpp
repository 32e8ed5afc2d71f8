// SPDX-License-Identifier: Apache-2.0
// A temporary directory for a test's files, removed with them at the end.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace wia::test {

struct TempDir {
  std::string path;
  std::vector<std::string> files;

  explicit TempDir(const std::string& prefix = "wia_test") {
    std::string t = "/tmp/" + prefix + "_XXXXXX";
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    for (const auto& f : files) std::remove(f.c_str());
    rmdir(path.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // A path in the directory, removed at the end (the test may create it).
  std::string file(const std::string& name) {
    files.push_back(path + "/" + name);
    return files.back();
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = file(name);
    std::ofstream(p) << text;
    return p;
  }
};

}  // namespace wia::test
