// Keywords of the parameter file as enums, each with ONE table of names.
//
// A keyword enum E declares, beside itself, the table of its values and
// their names and a function that returns it, found by argument-dependent
// lookup:
//
//   enum class PipelineSchedule { gpipe, one_f_one_b };
//   inline constexpr EnumName<PipelineSchedule> kPipelineScheduleNames[] = {
//       {PipelineSchedule::gpipe, "gpipe"}, {PipelineSchedule::one_f_one_b, "1f1b"}};
//   constexpr std::span<const EnumName<PipelineSchedule>> enum_names(PipelineSchedule) {
//     return kPipelineScheduleNames;
//   }
//
// Parsing (the parameter file binds these enums directly), --help, error
// messages and the resolved configuration all read that table, so a value
// added there is accepted, documented and printed everywhere at once.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace meshlm {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

template <typename E>
concept NamedEnum = requires(E e) {
  { enum_names(e) } -> std::convertible_to<std::span<const EnumName<E>>>;
};

// The name of v ("?" for a value missing from the table: a programming error).
template <NamedEnum E>
const char* name_of(E v) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (n.value == v) return n.name;
  return "?";
}

// The value named s, or nothing.
template <NamedEnum E>
std::optional<E> enum_from_name(std::string_view s) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (s == n.name) return n.value;
  return std::nullopt;
}

// Every name in table order: "gpipe | 1f1b".
template <NamedEnum E>
std::string enum_choices(const char* separator = " | ") {
  std::string s;
  for (const EnumName<E>& n : enum_names(E{})) {
    if (!s.empty()) s += separator;
    s += n.name;
  }
  return s;
}

}  // namespace meshlm
