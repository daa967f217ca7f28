// tests/monitor/test_metrics.cpp — monitor::CsvLogger, TensorBoardWriter and MetricsLogger, read back by readers
// written here: a CSV parser, and a TFRecord + protobuf decoder with its own bitwise CRC-32C, sharing no code
// with the writer. (TensorBoard's own Python reader checks the same files in check_tensorboard.py.)
#include <gtest/gtest.h>
#include <sys/resource.h>  // setrlimit: a file-size limit stands in for a full disk
#include <unistd.h>        // getpid

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "kiln/monitor/metrics.h"
#include "kiln/monitor/metrics_tfrecord.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::monitor {
namespace {

namespace fs = std::filesystem;
using kiln::testing::expect_error;
using kiln::testing::TempFolder;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---------------------------------------------------------------- an independent CSV reader

struct Csv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  int header_lines = 0;  // lines equal to the header (must be 1)
};

Csv parse_csv(const fs::path& p) {
  Csv csv;
  std::istringstream in(read_file(p));
  std::string line;
  std::string header_line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    size_t start = 0;
    for (size_t comma; (comma = line.find(',', start)) != std::string::npos; start = comma + 1)
      cells.push_back(line.substr(start, comma - start));
    cells.push_back(line.substr(start));
    if (csv.header.empty()) {
      csv.header = cells;
      header_line = line;
      ++csv.header_lines;
    } else if (line == header_line) {
      ++csv.header_lines;
    } else {
      csv.rows.push_back(cells);
    }
  }
  return csv;
}

std::vector<double> column(const Csv& csv, const std::string& name) {
  size_t i = 0;
  while (i < csv.header.size() && csv.header[i] != name) ++i;
  EXPECT_LT(i, csv.header.size()) << "no column " << name;
  std::vector<double> out;
  for (const auto& r : csv.rows) out.push_back(i < r.size() && !r[i].empty() ? std::stod(r[i]) : NAN);
  return out;
}

// ---------------------------------------------------------------- an independent event-file reader

// Bit by bit, straight from the definition (reflected 0x82F63B78), not from the writer's tables.
uint32_t reference_crc32c(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char byte : s) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}
uint32_t reference_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(s.at(at + i))} << (8 * i);
  return v;
}

// Splits a file into its records, checking both CRCs of each; throws std::runtime_error on any damage.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) throw std::runtime_error("truncated record header at byte " + std::to_string(at));
    const std::string length_bytes = file.substr(at, 8);
    const uint64_t length = read_le(file, at, 8);
    if (read_le(file, at + 8, 4) != reference_mask(reference_crc32c(length_bytes)))
      throw std::runtime_error("length CRC mismatch at byte " + std::to_string(at));
    if (file.size() - at - 12 < length + 4) throw std::runtime_error("truncated record at byte " + std::to_string(at));
    std::string data = file.substr(at + 12, length);
    if (read_le(file, at + 12 + length, 4) != reference_mask(reference_crc32c(data)))
      throw std::runtime_error("data CRC mismatch at byte " + std::to_string(at));
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

struct Field {
  uint32_t number = 0, wire = 0;
  uint64_t integer = 0;  // varint, fixed32, fixed64
  std::string bytes;     // length-delimited
};

std::vector<Field> parse_message(const std::string& m) {
  std::vector<Field> fields;
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= m.size() || shift > 63) throw std::runtime_error("bad varint");
      const auto b = static_cast<unsigned char>(m[at++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < m.size()) {
    Field f;
    const uint64_t key = varint();
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) {
      f.integer = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      if (at + n > m.size()) throw std::runtime_error("truncated fixed field");
      f.integer = read_le(m, at, n);
      at += n;
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      if (at + n > m.size()) throw std::runtime_error("truncated bytes field");
      f.bytes = m.substr(at, n);
      at += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
  int session_status = -1;  // -1: no session_log
};

Event decode_event(const std::string& data) {
  Event e;
  for (const Field& f : parse_message(data)) {
    if (f.number == 1 && f.wire == 1) e.wall_time = std::bit_cast<double>(f.integer);
    else if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.integer);
    else if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    else if (f.number == 5 && f.wire == 2) {
      for (const Field& v : parse_message(f.bytes)) {
        EXPECT_EQ(v.number, 1u);
        std::pair<std::string, float> value;
        for (const Field& g : parse_message(v.bytes)) {
          if (g.number == 1 && g.wire == 2) value.first = g.bytes;
          if (g.number == 2 && g.wire == 5) value.second = std::bit_cast<float>(static_cast<uint32_t>(g.integer));
        }
        e.values.push_back(value);
      }
    } else if (f.number == 7 && f.wire == 2) {  // session_log (6 is the deprecated log_message)
      e.session_status = 0;
      for (const Field& g : parse_message(f.bytes))
        if (g.number == 1 && g.wire == 0) e.session_status = static_cast<int>(g.integer);
    } else {
      ADD_FAILURE() << "unexpected Event field " << f.number << " (wire type " << f.wire << ")";
    }
  }
  return e;
}

std::vector<Event> read_events(const fs::path& p) {
  std::vector<Event> events;
  for (const std::string& r : read_records(read_file(p))) events.push_back(decode_event(r));
  return events;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// ---------------------------------------------------------------- CRC-32C and framing

TEST(MetricsTfrecord, Crc32cCheckValue) {
  EXPECT_EQ(tfrecord::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tfrecord::crc32c(""), 0u);
  EXPECT_EQ(tfrecord::crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(tfrecord::crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
}

// The rest of RFC 3720 appendix B.4's vectors (the values there are written as the CRC's bytes, low byte first).
TEST(MetricsTfrecord, Crc32cRfc3720Vectors) {
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(tfrecord::crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(tfrecord::crc32c(down), 0x113FDB5Cu);
  // An iSCSI SCSI Read (10) command PDU, 48 bytes.
  const unsigned char pdu[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                                 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(tfrecord::crc32c(pdu, sizeof pdu), 0xD9963A56u);
}

TEST(MetricsTfrecord, Crc32cMatchesTheBitwiseDefinitionAtEveryLengthAndOffset) {
  std::string bytes;
  for (int i = 0; i < 300; ++i) bytes.push_back(static_cast<char>((i * 167 + 13) ^ (i >> 3)));
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= bytes.size(); n += (n < 40 ? 1 : 37)) {
      const std::string s = bytes.substr(offset, n);
      ASSERT_EQ(tfrecord::crc32c(s), reference_crc32c(s)) << "length " << n << " offset " << offset;
    }
  }
  // Chained: the CRC of a + b from the CRC of a.
  const std::string a = bytes.substr(0, 77), b = bytes.substr(77);
  EXPECT_EQ(tfrecord::crc32c(b.data(), b.size(), tfrecord::crc32c(a)), reference_crc32c(a + b));
  EXPECT_EQ(tfrecord::masked_crc32c(a), reference_mask(reference_crc32c(a)));
}

TEST(MetricsTfrecord, FrameIsLengthCrcDataCrc) {
  const std::string framed = tfrecord::frame("hello");
  ASSERT_EQ(framed.size(), 5u + 16u);
  EXPECT_EQ(read_le(framed, 0, 8), 5u);
  EXPECT_EQ(framed.substr(12, 5), "hello");
  EXPECT_EQ(read_records(framed), std::vector<std::string>{"hello"});
  EXPECT_EQ(read_records(tfrecord::frame("")), std::vector<std::string>{""});
}

// The bytes TensorBoard's own writer (its RecordWriter and protobuf classes, its own CRC-32C) wrote for three events
// (tests/golden/make_golden_tfrecord.py), against kiln's for the same events.
TEST(MetricsTfrecord, TfrecordGoldenFromTensorBoardsWriter) {
  const std::string golden = read_file(fs::path(KILN_GOLDEN_DIR) / "tensorboard_events.tfrecord");
  ASSERT_EQ(golden.size(), 124u) << "regenerate it with tests/golden/make_golden_tfrecord.py";
  const std::string kiln =
      tfrecord::frame(tfrecord::file_version_event(1700000000.5)) +
      tfrecord::frame(tfrecord::scalars_event(1700000001.25, 100, {{"loss", 0.25}, {"lr", 0.001}})) +
      tfrecord::frame(tfrecord::session_start_event(1700000002.0, 7));
  EXPECT_EQ(kiln, golden);
  // Record by record, so that a difference says which.
  const auto want = read_records(golden), got = read_records(kiln);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "record " << i;
}

TEST(MetricsTfrecord, EventsDecodeIndependently) {
  const Event v = decode_event(tfrecord::file_version_event(1234.5));
  EXPECT_EQ(v.file_version, "brain.Event:2");
  EXPECT_EQ(v.wall_time, 1234.5);
  const Event s = decode_event(tfrecord::session_start_event(7.0, 41));
  EXPECT_EQ(s.session_status, 1);
  EXPECT_EQ(s.step, 41);
  const Event x = decode_event(tfrecord::scalars_event(8.0, -3, {{"a/b", 0.1}, {"c", -2e30}}));
  EXPECT_EQ(x.step, -3);  // int64 as a 10-byte varint
  ASSERT_EQ(x.values.size(), 2u);
  EXPECT_EQ(x.values[0].first, "a/b");
  EXPECT_EQ(x.values[0].second, 0.1f);
  EXPECT_EQ(x.values[1].first, "c");
  EXPECT_EQ(x.values[1].second, -2e30f);
  const Event big = decode_event(tfrecord::scalars_event(0, int64_t{1} << 40, {{std::string(300, 't'), 1}}));
  EXPECT_EQ(big.step, int64_t{1} << 40);
  EXPECT_EQ(big.values.at(0).first.size(), 300u);  // a tag whose length takes a 2-byte varint
}

// ---------------------------------------------------------------- CSV

TEST(MetricsCsv, RowsParseBackWithTheHeaderOnce) {
  TempFolder dir;
  const fs::path p = dir / "run/sub/metrics.csv";  // folders created
  {
    CsvLogger csv(p, {"epoch", "step", "loss"});
    csv.row({1, 10, 0.5});
    csv.named_row({{"loss", 0.25}, {"step", 20}, {"epoch", 1}});  // by name, any order
    csv.named_row({{"step", 30}});                                // the others left empty
  }
  const Csv csv = parse_csv(p);
  EXPECT_EQ(csv.header, (std::vector<std::string>{"epoch", "step", "loss"}));
  EXPECT_EQ(csv.header_lines, 1);
  ASSERT_EQ(csv.rows.size(), 3u);
  EXPECT_EQ(column(csv, "step"), (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(csv.rows[0], (std::vector<std::string>{"1", "10", "0.5"}));
  EXPECT_EQ(csv.rows[2], (std::vector<std::string>{"", "30", ""}));
}

TEST(MetricsCsv, ValuesRoundTripExactly) {
  TempFolder dir;
  const std::vector<double> values{0.1,
                                   1.0 / 3.0,
                                   1e-300,
                                   6.02214076e23,
                                   -0.0,
                                   123456789012345.0,
                                   std::numeric_limits<double>::denorm_min(),
                                   std::nextafter(1.0, 2.0)};
  {
    CsvLogger csv(dir / "v.csv", {"v"});
    for (double v : values) csv.row({v});
    csv.row({NAN});
    csv.row({INFINITY});
    csv.row({-INFINITY});
  }
  const Csv csv = parse_csv(dir / "v.csv");
  ASSERT_EQ(csv.rows.size(), values.size() + 3);
  for (size_t i = 0; i < values.size(); ++i)  // strtod: stod refuses subnormals (ERANGE)
    EXPECT_EQ(std::strtod(csv.rows[i][0].c_str(), nullptr), values[i]) << csv.rows[i][0];
  EXPECT_EQ(csv.rows[0][0], "0.1");  // the shortest text, not 0.10000000000000001
  EXPECT_EQ(csv.rows[values.size()][0], "nan");
  EXPECT_EQ(csv.rows[values.size() + 1][0], "inf");
  EXPECT_EQ(csv.rows[values.size() + 2][0], "-inf");
  EXPECT_EQ(format_csv_number(3), "3");
  EXPECT_EQ(format_csv_number(1e-5), "1e-05");
}

TEST(MetricsCsv, ResumeDropsTheRowsFromTheResumeStepAndAppends) {
  TempFolder dir;
  const fs::path p = dir / "m.csv";
  {
    CsvLogger first(p, {"step", "loss"});
    for (int s = 1; s <= 10; ++s) first.row({static_cast<double>(s), 1.0 / s});
  }
  {
    CsvLogger resumed(p, {"step", "loss"}, {.resume_step = 6});  // the checkpoint held 5 steps done
    EXPECT_EQ(resumed.rows_kept(), 5);
    EXPECT_EQ(resumed.rows_dropped(), 5);
    EXPECT_FALSE(fs::exists(dir / "m.csv.tmp"));
    for (int s = 6; s <= 12; ++s) resumed.row({static_cast<double>(s), 100.0 + s});
  }
  const Csv csv = parse_csv(p);
  EXPECT_EQ(csv.header_lines, 1);
  EXPECT_EQ(column(csv, "step"), (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  const std::vector<double> loss = column(csv, "loss");
  EXPECT_EQ(loss[4], 1.0 / 5);
  EXPECT_EQ(loss[5], 106.0);
  // A resume with nothing to drop leaves the file as it was and appends.
  const std::string before = read_file(p);
  {
    CsvLogger again(p, {"step", "loss"}, {.resume_step = 13});
    EXPECT_EQ(again.rows_dropped(), 0);
    again.row({13, 0});
  }
  EXPECT_EQ(read_file(p), before + "13,0\n");
}

TEST(MetricsCsv, ResumeDropsARowCutShortByACrash) {
  TempFolder dir;
  const fs::path p = dir.write("m.csv", "step,loss\n1,0.5\n2,0.25\n3,0.1");  // the last row has no line end
  {
    CsvLogger csv(p, {"step", "loss"}, {.resume_step = 3});
    EXPECT_EQ(csv.rows_kept(), 2);
    csv.row({3, 0.125});
  }
  EXPECT_EQ(read_file(p), "step,loss\n1,0.5\n2,0.25\n3,0.125\n");
  // A header cut before its line break is mended too.
  const fs::path h = dir.write("h.csv", "step,loss");
  { CsvLogger(h, {"step", "loss"}, {.resume_step = 0}).row({0, 1}); }
  EXPECT_EQ(read_file(h), "step,loss\n0,1\n");
}

TEST(MetricsCsv, ResumeWithoutAFileStartsOne) {
  TempFolder dir;
  { CsvLogger(dir / "new.csv", {"step", "x"}, {.resume_step = 100}).row({100, 1}); }
  EXPECT_EQ(read_file(dir / "new.csv"), "step,x\n100,1\n");
}

TEST(MetricsCsv, ANewRunStartsTheFileAfresh) {
  TempFolder dir;
  const fs::path p = dir.write("m.csv", "step,loss\n1,0.5\n");
  { CsvLogger(p, {"step", "acc"}).row({1, 0.9}); }  // not resuming: another header is fine
  EXPECT_EQ(read_file(p), "step,acc\n1,0.9\n");
}

TEST(MetricsCsv, ResumeOntoAnotherHeaderIsAClearError) {
  TempFolder dir;
  const std::string text = "epoch,step,loss\n1,1,0.5\n";
  const fs::path p = dir.write("m.csv", text);
  expect_error(
      [&] {
        CsvLogger(p, {"epoch", "step", "loss", "lr"}, {.resume_step = 1});
      },
      {p.string(), "has the columns 'epoch,step,loss'", "this run logs 'epoch,step,loss,lr'", "move the file away"});
  EXPECT_EQ(read_file(p), text);  // untouched
}

TEST(MetricsCsv, BadInputIsAClearError) {
  TempFolder dir;
  expect_error(
      [&] {
        CsvLogger(dir / "a.csv", {"epoch", "loss"}, {.resume_step = 3});
      },
      {"'step' column, which is not among the columns (epoch,loss)"});
  expect_error([&] { CsvLogger(dir / "b.csv", {"a", "a"}); }, {"column 'a' is given twice"});
  expect_error([&] { CsvLogger(dir / "c.csv", {"a,b"}); }, {"holds a comma"});
  CsvLogger csv(dir / "d.csv", {"step", "loss"});
  expect_error([&] { csv.row({1}); }, {"a row of 1 values for the 2 columns step,loss"});
  expect_error([&] { csv.named_row({{"acc", 1}}); }, {"'acc' is not one of the columns step,loss"});
  const fs::path bad = dir.write("e.csv", "step,loss\n1,0.5\nx,0.3\n");
  expect_error(
      [&] {
        CsvLogger(bad, {"step", "loss"}, {.resume_step = 5});
      },
      {"e.csv line 3", "step cell 'x' is not a number"});
}

TEST(MetricsCsv, UnwritableFolderAndFullDiskAreClearErrors) {
  TempFolder dir;
  const fs::path file = dir.write("not_a_folder", "x");  // a file where a folder should be (root or not)
  expect_error([&] { CsvLogger(file / "m.csv", {"step"}); },
               {"cannot create the folder", (file).string(), "choose a folder you can write to"});
  expect_error([&] { CsvLogger(dir.path(), {"step"}); }, {"cannot open", "for writing", "Is a directory"});
  if (fs::exists("/dev/full")) {  // every write fails with ENOSPC
    expect_error([&] { CsvLogger("/dev/full", {"step"}); }, {"cannot write to /dev/full", "No space left on device"});
  }
}

// ---------------------------------------------------------------- TensorBoard

TEST(MetricsTensorBoard, ScalarsReadBack) {
  TempFolder dir;
  fs::path file;
  {
    TensorBoardWriter tb(dir / "tb");  // folder created
    file = tb.path();
    for (int s = 0; s < 5; ++s) tb.add_scalar("train/loss", 1.0 / (s + 1), s, 1000.0 + s);
    tb.add_scalars(5, {{"train/loss", 0.125}, {"train/lr", 1e-3}});
  }
  const std::string name = file.filename().string();
  EXPECT_EQ(file.parent_path(), dir / "tb");
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(::getpid()) + "."), std::string::npos) << name;
  const std::vector<Event> events = read_events(file);
  ASSERT_EQ(events.size(), 2u + 6u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.5e9);   // now, in seconds since 1970
  EXPECT_EQ(events[1].session_status, 1);  // START
  EXPECT_EQ(events[1].step, 0);
  for (int s = 0; s < 5; ++s) {
    const Event& e = events[2 + s];
    EXPECT_EQ(e.step, s);
    EXPECT_EQ(e.wall_time, 1000.0 + s);
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_EQ(e.values[0].first, "train/loss");
    EXPECT_EQ(e.values[0].second, static_cast<float>(1.0 / (s + 1)));
  }
  ASSERT_EQ(events[7].values.size(), 2u);
  EXPECT_EQ(events[7].step, 5);
  EXPECT_EQ(events[7].values[1].first, "train/lr");
  EXPECT_EQ(events[7].values[1].second, 1e-3f);
}

TEST(MetricsTensorBoard, ACorruptedByteIsDetected) {
  TempFolder dir;
  fs::path file;
  {
    TensorBoardWriter tb(dir.path());
    file = tb.path();
    tb.add_scalar("loss", 0.5, 1);
  }
  const std::string good = read_file(file);
  ASSERT_NO_THROW(read_records(good));
  std::string data_flip = good;
  data_flip[good.size() - 6] ^= 0x01;  // inside the last record's data
  EXPECT_THROW(read_records(data_flip), std::runtime_error);
  std::string length_flip = good;
  length_flip[0] ^= 0x01;  // the first record's length
  try {
    read_records(length_flip);
    ADD_FAILURE() << "a flipped length bit went unnoticed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("length CRC mismatch"), std::string::npos) << e.what();
  }
}

TEST(MetricsTensorBoard, ResumeWritesSessionStartAtTheResumeStepInANewFileThatSortsLast) {
  TempFolder dir;
  // A file of an earlier run whose name sorts after now (another clock, same second and a larger pid, ...).
  dir.write("events.out.tfevents.9999999990.zz.99999.0", "");
  fs::path file;
  {
    TensorBoardWriter tb(dir.path(), {.resume_step = 42});
    file = tb.path();
    tb.add_scalar("loss", 2, 42);
  }
  const std::vector<fs::path> files = event_files(dir.path());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files.back(), file) << "TensorBoard reads files in name order: the resumed run's must come last";
  const std::vector<Event> events = read_events(file);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].session_status, 1);
  EXPECT_EQ(events[1].step, 42);
  EXPECT_EQ(events[2].step, 42);
}

TEST(MetricsTensorBoard, BufferedUntilFlushOrEnoughRecords) {
  TempFolder dir;
  TensorBoardWriter tb(dir.path(), {.flush_seconds = 3600, .flush_records = 3});
  const auto header = fs::file_size(tb.path());  // version + START, written at once
  EXPECT_GT(header, 0u);
  tb.add_scalar("a", 1, 1);
  tb.add_scalar("a", 2, 2);
  EXPECT_EQ(fs::file_size(tb.path()), header);
  tb.add_scalar("a", 3, 3);  // the third record flushes
  EXPECT_EQ(read_events(tb.path()).size(), 5u);
  tb.add_scalar("a", 4, 4);
  EXPECT_EQ(read_events(tb.path()).size(), 5u);
  tb.flush();
  EXPECT_EQ(read_events(tb.path()).size(), 6u);
  TensorBoardWriter timed(dir / "t", {.flush_seconds = 0});  // every add is older than 0 s: written at once
  timed.add_scalar("a", 1, 1);
  EXPECT_EQ(read_events(timed.path()).size(), 3u);
}

TEST(MetricsTensorBoard, DestructorFlushes) {
  TempFolder dir;
  fs::path file;
  {
    TensorBoardWriter tb(dir.path(), {.flush_seconds = 3600});
    file = tb.path();
    tb.add_scalar("a", 1, 1);
  }
  EXPECT_EQ(read_events(file).size(), 3u);
}

TEST(MetricsTensorBoard, OneWriterPerFolderInAProcess) {
  TempFolder dir;
  {
    TensorBoardWriter tb(dir / "tb");
    expect_error([&] { TensorBoardWriter second(dir / "tb/."); }, {"already written by another TensorBoardWriter"});
  }
  TensorBoardWriter after(dir / "tb");  // the first one is gone
  EXPECT_EQ(event_files(dir / "tb").size(), 2u);
}

TEST(MetricsTensorBoard, UnwritableFolderIsAClearError) {
  TempFolder dir;
  const fs::path file = dir.write("not_a_folder", "x");
  expect_error([&] { TensorBoardWriter tb(file / "tb"); }, {"cannot create the folder", file.string()});
  expect_error([&] { TensorBoardWriter tb(file); }, {"cannot create the folder", file.string()});
}

// A full disk, as a file-size limit (EFBIG) in a child process: the flush throws, naming the file.
TEST(MetricsTensorBoardDeathTest, FullDiskIsAClearError) {
  TempFolder dir;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        TensorBoardWriter tb(dir.path(), {.flush_seconds = 3600});
        std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of the signal ending the process
        rlimit limit{};
        limit.rlim_cur = limit.rlim_max = fs::file_size(tb.path()) + 100;
        setrlimit(RLIMIT_FSIZE, &limit);
        try {
          for (int s = 0; s < 100; ++s) tb.add_scalar("loss", s, s);  // the 100th add flushes
          tb.flush();
        } catch (const kiln::Error& e) {
          std::cerr << e.what() << "\n";
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(3), "cannot write .*events.out.tfevents.*File too large");
}

// ---------------------------------------------------------------- MetricsLogger

TEST(MetricsLogger, OneCallWritesTheCsvRowAndTheTensorBoardPoints) {
  TempFolder dir;
  {
    MetricsLogger log({.csv = dir / "run/metrics.csv", .tensorboard_dir = dir / "run/tb", .tag_prefix = "train/"});
    log.log(10, {{"loss", 0.5}, {"lr", 0.1}});
    log.log(20, {{"loss", 0.25}, {"lr", 0.05}});
    expect_error([&] { log.log(30, {{"step", 1}}); }, {"the step is log's first argument"});
    expect_error([&] { log.log(30, {{"acc", 1}}); }, {"'acc' is not one of the columns step,loss,lr"});
  }
  const Csv csv = parse_csv(dir / "run/metrics.csv");
  EXPECT_EQ(csv.header, (std::vector<std::string>{"step", "loss", "lr"}));  // from the first call
  EXPECT_EQ(column(csv, "step"), (std::vector<double>{10, 20}));
  EXPECT_EQ(column(csv, "lr"), (std::vector<double>{0.1, 0.05}));
  const auto files = event_files(dir / "run/tb");
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Event> events = read_events(files[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].step, 10);
  ASSERT_EQ(events[3].values.size(), 2u);  // "step" is the x axis, not a scalar
  EXPECT_EQ(events[3].values[0].first, "train/loss");
  EXPECT_EQ(events[3].values[0].second, 0.25f);
}

TEST(MetricsLogger, ColumnsGivenUpFrontAreCheckedAtOnceAndKeepTheirOrder) {
  TempFolder dir;
  const fs::path p = dir.write("m.csv", "epoch,step,loss\n1,5,0.5\n2,10,0.25\n");
  expect_error(
      [&] {
        MetricsLogger({.csv = p, .columns = {"step", "loss"}, .resume_step = 6});
      },
      {"has the columns 'epoch,step,loss'"});
  expect_error(
      [&] {
        MetricsLogger({.csv = dir / "x.csv", .columns = {"epoch", "loss"}});
      },
      {"need a \"step\" column"});
  {
    MetricsLogger log({.csv = p, .columns = {"epoch", "step", "loss"}, .resume_step = 6});
    log.log(6, {{"loss", 0.125}, {"epoch", 2}});
  }
  EXPECT_EQ(read_file(p), "epoch,step,loss\n1,5,0.5\n2,6,0.125\n");
}

TEST(MetricsLogger, SharesOneTensorBoardWriterBetweenLoggers) {
  TempFolder dir;
  {
    MetricsLogger train({.csv = dir / "train.csv", .tensorboard_dir = dir / "tb", .tag_prefix = "train/"});
    MetricsLogger eval({.csv = dir / "eval.csv", .tensorboard = train.tensorboard(), .tag_prefix = "eval/"});
    train.log(1, {{"loss", 1}});
    eval.log(1, {{"loss", 2}});
  }
  const auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Event> events = read_events(files[0]);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[3].values.at(0).first, "eval/loss");
}

TEST(MetricsLogger, DisabledWritesNothing) {
  TempFolder dir;
  {
    MetricsLogger log(
        {.csv = dir / "m.csv", .columns = {"step", "loss"}, .tensorboard_dir = dir / "tb", .enabled = false});
    log.log(1, {{"loss", 1}});
    log.flush();
    EXPECT_EQ(log.tensorboard(), nullptr);
  }
  EXPECT_FALSE(fs::exists(dir / "m.csv"));
  EXPECT_FALSE(fs::exists(dir / "tb"));
}

TEST(MetricsLogger, ResumeAppliesToBoth) {
  TempFolder dir;
  const MetricsOptions o{.csv = dir / "m.csv", .tensorboard_dir = dir / "tb"};
  {
    MetricsLogger first(o);
    for (int s = 0; s < 10; ++s) first.log(s, {{"loss", s}});
  }
  {
    MetricsOptions r = o;
    r.resume_step = 5;
    MetricsLogger resumed(r);
    for (int s = 5; s < 13; ++s) resumed.log(s, {{"loss", 100 + s}});
  }
  const Csv csv = parse_csv(dir / "m.csv");
  EXPECT_EQ(column(csv, "step"), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(column(csv, "loss")[4], 4);
  EXPECT_EQ(column(csv, "loss")[5], 105);
  const auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 2u);
  const std::vector<Event> second = read_events(files[1]);
  EXPECT_EQ(second[1].session_status, 1);
  EXPECT_EQ(second[1].step, 5);
}

}  // namespace
}  // namespace kiln::monitor
