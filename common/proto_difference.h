// Which fields of two messages of one type differ, in words: for the
// refusals that say exactly what disagrees ("num_trainers: registered 2,
// this trainer 3").
#ifndef SHARDOPT_COMMON_PROTO_DIFFERENCE_H_
#define SHARDOPT_COMMON_PROTO_DIFFERENCE_H_

#include <string>

#include <google/protobuf/message.h>

#include "absl/strings/string_view.h"

namespace shardopt {

// "field.path: <first_name> <value>, <second_name> <value>" for every
// differing leaf field, joined with "; " (at most `max_fields` of them,
// then "and N more"). Empty when they are equal. Unset message fields read
// "(unset)", missing repeated elements "(none)".
std::string DescribeDifferences(const google::protobuf::Message& first,
                                const google::protobuf::Message& second,
                                absl::string_view first_name, absl::string_view second_name,
                                int max_fields = 8);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_PROTO_DIFFERENCE_H_
