#include "common/proto_difference.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardopt {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::util::MessageDifferencer;
using Path = std::vector<MessageDifferencer::SpecificField>;

std::string PathName(const Path& path) {
  std::string name;
  for (const MessageDifferencer::SpecificField& f : path) {
    if (f.field == nullptr) return absl::StrCat(name, name.empty() ? "" : ".", "(unknown field)");
    absl::StrAppend(&name, name.empty() ? "" : ".", f.field->name());
    if (f.field->is_repeated() && f.index >= 0 && &f != &path.back()) {
      absl::StrAppend(&name, "[", f.index, "]");
    }
  }
  return name;
}

// The value of the last field of `path` in `message`, the message that
// holds it (what the differencer reports); `second`: the index of the
// second message's element.
std::string ValueAt(const Message& message, const Path& path, bool second) {
  const MessageDifferencer::SpecificField& leaf = path.back();
  const FieldDescriptor* field = leaf.field;
  if (field == nullptr) return "(unknown)";
  const Reflection* reflection = message.GetReflection();
  if (field->is_repeated()) {
    const int size = reflection->FieldSize(message, field);
    const int index = second ? leaf.new_index : leaf.index;
    if (index < 0) {
      // The whole list.
      std::vector<std::string> items;
      for (int k = 0; k < size; ++k) {
        std::string item;
        google::protobuf::TextFormat::PrintFieldValueToString(message, field, k, &item);
        items.push_back(item);
      }
      return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
    }
    if (index >= size) return "(none)";
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      return absl::StrCat("{", reflection->GetRepeatedMessage(message, field, index).ShortDebugString(),
                          "}");
    }
    std::string item;
    google::protobuf::TextFormat::PrintFieldValueToString(message, field, index, &item);
    return item;
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    if (!reflection->HasField(message, field)) return "(unset)";
    return absl::StrCat("{", reflection->GetMessage(message, field).ShortDebugString(), "}");
  }
  std::string value;
  google::protobuf::TextFormat::PrintFieldValueToString(message, field, -1, &value);
  return value;
}

class Collector : public MessageDifferencer::Reporter {
 public:
  Collector(absl::string_view first_name, absl::string_view second_name)
      : first_name_(first_name), second_name_(second_name) {}

  void ReportAdded(const Message& a, const Message& b, const Path& path) override {
    Add(a, b, path);
  }
  void ReportDeleted(const Message& a, const Message& b, const Path& path) override {
    Add(a, b, path);
  }
  void ReportModified(const Message& a, const Message& b, const Path& path) override {
    // A modified message is reported after the fields that differ in it.
    if (!path.empty() && path.back().field != nullptr &&
        path.back().field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      return;
    }
    Add(a, b, path);
  }

  std::vector<std::string> lines;

 private:
  void Add(const Message& a, const Message& b, const Path& path) {
    lines.push_back(absl::StrCat(PathName(path), ": ", first_name_, " ", ValueAt(a, path, false),
                                 ", ", second_name_, " ", ValueAt(b, path, true)));
  }
  const std::string first_name_, second_name_;
};

}  // namespace

std::string DescribeDifferences(const Message& first, const Message& second,
                                absl::string_view first_name, absl::string_view second_name,
                                int max_fields) {
  Collector collector(first_name, second_name);
  MessageDifferencer differencer;
  differencer.ReportDifferencesTo(&collector);
  if (differencer.Compare(first, second)) return "";
  std::vector<std::string>& lines = collector.lines;
  const size_t shown = std::min<size_t>(lines.size(), static_cast<size_t>(max_fields));
  std::string out = absl::StrJoin(lines.begin(), lines.begin() + shown, "; ");
  if (lines.size() > shown) absl::StrAppend(&out, "; and ", lines.size() - shown, " more");
  return out;
}

}  // namespace shardopt
