"""`export const meta` read as a pure literal (swarmbase/script_meta.py): what Claude Code's
Workflow tool accepts is accepted, what it refuses is refused with the reason."""

from __future__ import annotations

import pytest

from swarmbase.script import meta as script_meta
from swarmbase.script.meta import MetaError, Phase


def test_a_full_literal_with_comments_and_trailing_commas() -> None:
    found = script_meta.read("""// leading comment
/* and a block */
export const meta = {
  name: 'review-changes',          // unquoted keys, single quotes
  "description": "Review, then \\"verify\\"\\n",
  whenToUse: `when a diff is ready`,
  phases: [{ title: 'Review', detail: 'one agent per file' }, { title: 'Verify', model: 'haiku', }, ],
  extra: [1, -2.5, 3e2, true, false, null, { nested: [] }],
};
phase('Review');""")
    meta = found.meta
    assert meta is not None
    assert meta.name == "review-changes"
    assert meta.description == 'Review, then "verify"\n'
    assert meta.when_to_use == "when a diff is ready"
    assert meta.phases == (Phase("Review", "one agent per file", None), Phase("Verify", None, "haiku"))
    assert meta.phase_model("Verify") == "haiku" and meta.phase_model("Review") is None
    assert meta.to_json() == {"name": "review-changes", "description": 'Review, then "verify"\n',
                              "whenToUse": "when a diff is ready",
                              "phases": [{"title": "Review", "detail": "one agent per file"},
                                         {"title": "Verify", "model": "haiku"}]}
    assert 0 < found.start < found.end


def test_statement_may_end_with_a_newline_or_the_script() -> None:
    assert script_meta.read("export const meta = { name: 'a', description: 'b' }\nreturn 1").meta.name == "a"
    assert script_meta.read("export const meta = { name: 'a', description: 'b' }").meta.name == "a"
    assert script_meta.read("export const meta = {name:'a',description:'b'};return 1").meta.name == "a"


def test_no_meta_is_fine_and_optional_fields_may_be_missing() -> None:
    assert script_meta.read("return 1").meta is None
    assert script_meta.read("// meta would go here\nreturn 1").meta is None
    assert script_meta.read("export const meta = { name: 'only a name' }").meta.description is None


@pytest.mark.parametrize("script,why", [
    ("const x = 'n';\nexport const meta = { name: x, description: 'd' }", "must be the FIRST statement"),
    ("phase('a')\nexport const meta = { name: 'n', description: 'd' }", "must be the FIRST statement"),
    ("export const meta = { name: NAME, description: 'd' }", "pure literal"),
    ("export const meta = { name: 'n', description: `d ${x}` }", "pure literal"),
    ("export const meta = { name: 'n', description: 'd', ...more }", "pure literal"),
    ("export const meta = { [key]: 'n', description: 'd' }", "pure literal"),
    ("export const meta = { name: 'n'.toUpperCase(), description: 'd' }", "pure literal"),
    ("export const meta = { name: 'n', description: 'd' }.name", "pure literal"),
    ("export const meta = { name: 'n', description: 'd' }\n in other", "pure literal"),
    ("export const meta = { name: 'n', description: f() }", "pure literal"),
    ("export const meta = { __proto__: { name: 'n' }, description: 'd' }", "pure literal"),
    ("export const meta = { name: 'n', description: 'd', x: 1.2.3 }", "pure literal"),
    ("export const meta = { name: 'unterminated, description: 'd' }", "pure literal"),
    ("export const meta = { name: '', description: 'd' }", "meta.name must be a non-empty string"),
    ("export const meta = { name: 'n', description: 7 }", "meta.description must be a non-empty string"),
    ("export const meta = { name: 'n', whenToUse: 3 }", "meta.whenToUse must be a string"),
])
def test_refusals_say_why(script: str, why: str) -> None:
    with pytest.raises(MetaError, match=why.replace("(", r"\(")):
        script_meta.read(script)


def test_escapes_as_javascript_reads_them() -> None:
    meta = script_meta.read(r"export const meta = { name: '\x41\u0042\u{1F600}\t\0', description: 'a\
b' }").meta
    assert meta.name == "AB\U0001F600\t\x00"
    assert meta.description == "ab"


def test_describe_is_none_for_unusable_or_missing_meta() -> None:
    assert script_meta.describe("return 1") is None
    assert script_meta.describe("export const meta = { name: x }") is None
    assert script_meta.describe("export const meta = { name: 'n', description: 'd', whenToUse: 'w' }") == \
        {"name": "n", "description": "d", "whenToUse": "w"}
