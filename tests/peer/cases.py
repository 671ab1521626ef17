"""The conformance scripts: each runs unchanged through Claude Code's Workflow runtime and
through SwarmBase, against the same deterministic model (tests/peer/model.py), and must
end the same way with the same return value — unless the case names a deliberate
difference, whose exact shape its `check` asserts (and swarmbase/guide.md explains).

Every hook, option and rule of the language has a case: agent() (text, schema, null on a
terminal API error, label, phase, model, effort, agentType, isolation), parallel() and
pipeline() (order, stage arguments, throw → null, promises refused, empty input, null
skipping stages), phase(), log(), args (given, absent, mutated), budget (shape, the two
sizing idioms), workflow() (by name, unknown name, {scriptPath}), export const meta
(phases), the return value (undefined, a function), a top-level throw, the schema root
rule, the Workflow call shape (name, scriptPath, title/description), and resume.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from .model import DEFAULT_OUTPUT_TOKENS, MAIN_OUTPUT_TOKENS

META = "export const meta = { name: 'conformance', description: 'a conformance script' }\n"
NO_ARGS = object()

Check = Callable[[Any, Any], None]


@attrs.frozen
class Case:
    name: str
    script: str
    args: Any = NO_ARGS
    # A deliberate difference: what it is. `check(cc, sb)` then asserts its exact shape.
    differs: str | None = None
    check: Check | None = None
    needs: tuple[str, ...] = ()          # set-up: "saved-sub", "repo", "script-file", "target"
    call: dict[str, Any] = attrs.Factory(dict)     # more Workflow call keys (both runtimes)
    no_meta: bool = False                # run the script as it is, without the usual meta block
    # On the peer, calls of one batch share the turn's budget.spent(): a case that reads it
    # runs in a CLI of its own.
    alone: bool = False

    @property
    def full_script(self) -> str:
        if self.no_meta or self.script.startswith("export const meta"):
            return self.script
        return META + self.script

    def workflow_input(self) -> dict[str, Any]:
        call: dict[str, Any] = {"script": self.full_script, **self.call}
        if self.args is not NO_ARGS:
            call["args"] = self.args
        return call


def _logs_have(line: str) -> Check:
    def check(cc: Any, sb: Any) -> None:
        assert line in cc.logs, cc.logs
        assert line in sb.logs, sb.logs
    return check


def _phase_of_labels(cc: Any, sb: Any) -> None:
    """Each labelled agent is filed under the same phase in both runtimes."""
    peer = {p["label"]: p.get("phaseTitle") for p in cc.record.get("workflowProgress", [])
            if p.get("type") == "workflow_agent"}
    ours = {a["label"]: ph["title"] for ph in sb.phases for a in ph.get("agents", [])}
    assert peer == ours, (peer, ours)


def _declared_lanes(cc: Any, sb: Any) -> None:
    peer = [p["title"] for p in cc.record.get("workflowProgress", []) if p.get("type") == "workflow_phase"]
    ours = [p["title"] for p in sb.phases]
    assert peer[:3] == ours[:3] == ["Scan", "Fix", "Report"], (peer, ours)
    assert "Report" in ours and not next(p for p in sb.phases if p["title"] == "Report")["agents"]


def _nesting(cc: Any, sb: Any) -> None:
    assert cc.result == {"threw": "workflow() cannot be called from within a child workflow \u2014 nesting is "
                                  "limited to one level. Inline the inner script or call its agents directly."}
    assert sb.result == {"inner": "re: deep"}


def _clock(cc: Any, sb: Any) -> None:
    # Claude Code refuses the whole call before it runs (a static check of the text);
    # SwarmBase runs it, and the call that reads the clock throws inside the script.
    assert cc is None or cc.status != "completed"
    assert sb.status == "completed" and sb.result.startswith("Date.now() would differ when the run is resumed")


def _timers(cc: Any, sb: Any) -> None:
    assert cc.result == "function"
    assert sb.result == "undefined"


def _target(cc: Any, sb: Any) -> None:
    # Claude Code 2.1.328 never sets a token target; SwarmBase's is the run's tokenTarget.
    assert cc.result == {"total": None, "infinite": True}
    assert sb.result == {"total": 1000, "infinite": False}


def _meta_optional(cc: Any, sb: Any) -> None:
    assert cc is None                      # refused: the meta block must be the first statement
    assert sb.status == "completed" and sb.result == "ran"


def _meta_constant(cc: Any, sb: Any) -> None:
    assert cc.result == {"type": "undefined"} and sb.result == {"type": "object", "name": "constant"}


def _phase_model(cc: Any, sb: Any) -> None:
    assert cc.result == "model: claude-opus-5-5"            # the session's model
    assert sb.result.startswith("model: ") and "haiku" in sb.result


def _args_null(cc: Any, sb: Any) -> None:
    assert cc.result == {"type": "object", "isNull": True}
    assert sb.result == {"type": "undefined", "isNull": False}


def _required_missing(cc: Any, sb: Any) -> None:
    # Both throw; the peer only after its agent ran and could not satisfy the schema.
    assert "completed without calling StructuredOutput" in cc.result
    assert "it requires 'b', which is not in its properties" in sb.result


def _display(cc: Any, sb: Any) -> None:
    assert cc.result == sb.result == "re: an unlabelled agent whose prompt is longer than sixty characters, by far"
    peer_labels = [p["label"] for p in cc.record.get("workflowProgress", []) if p.get("type") == "workflow_agent"]
    assert peer_labels == ["an unlabelled agent whose prompt is longer than sixty charac"]
    assert [a["label"] for ph in sb.phases for a in ph.get("agents", [])] == ["agent 1"]
    assert "[object]" in cc.logs and '{"x":1} second' in sb.logs


def _budget_spent(cc: Any, sb: Any) -> None:
    # Same shape, same agents' spend (2 agents × 10 output tokens); the peer's adds the main
    # session's output (MAIN_OUTPUT_TOKENS per main-session request so far: the session
    # goes on while the run does, so how many came before each read varies).
    same = {"total": None, "infinite": True, "kinds": ["function", "function"]}
    assert {k: cc.result[k] for k in same} == {k: sb.result[k] for k in same} == same, (cc.result, sb.result)
    assert sb.result["before"] == 0 and sb.result["after"] == 2 * DEFAULT_OUTPUT_TOKENS, sb.result
    main = cc.result["after"] - 2 * DEFAULT_OUTPUT_TOKENS
    assert cc.result["before"] > 0 and cc.result["before"] % MAIN_OUTPUT_TOKENS == 0, cc.result
    assert main >= cc.result["before"] and main % MAIN_OUTPUT_TOKENS == 0, cc.result


SCHEMA = "{type: 'object', properties: {title: {type: 'string'}, score: {type: 'integer', minimum: 1, maximum: 5}, " \
         "tags: {type: 'array', items: {type: 'string'}}, ok: {type: 'boolean'}, kind: {enum: ['bug', 'perf']}}, " \
         "required: ['title', 'score']}"

CASES: list[Case] = [
    Case("agent-text", "const a = await agent('say the word', {label: 'one'});\n"
                       "const b = await agent('[[say:exactly this]]');\nreturn {a, b};"),
    Case("agent-schema", f"const s = {SCHEMA};\nreturn await agent('rate the bug', {{schema: s, label: 'rate'}});"),
    Case("schema-empty-object", "return await agent('anything', {schema: {type: 'object'}});"),
    Case("schema-root-not-object",
         "try { await agent('never sent', {schema: {type: 'array', items: {type: 'string'}}}); return 'ran'; }\n"
         "catch (e) { return e.message.startsWith('agent({schema}) received an unusable JSON Schema'); }"),
    Case("agent-api-error-null", "const r = await agent('this one [[fail]]', {label: 'doomed'});\n"
                                 "return {r, after: await agent('after it')};"),
    Case("agent-options", "return await parallel([\n"
                          "  () => agent('with model', {model: 'haiku', label: 'm'}),\n"
                          "  () => agent('with effort', {effort: 'low', label: 'e'}),\n"
                          "  () => agent('typed', {agentType: 'general-purpose', label: 't'}),\n"
                          "  () => agent('explorer', {agentType: 'Explore', label: 'x'}),\n"
                          "]);"),
    Case("agent-type-unknown", "try { await agent('x', {agentType: 'nope'}); return 'ran'; }\n"
                               "catch (e) { return e.message.startsWith(\"agent({agentType}): agent type 'nope' not found.\"); }"),
    Case("parallel-order", "return await parallel([() => agent('first'), () => 7, async () => 'plain', () => agent('last')]);"),
    Case("parallel-throw-is-null",
         "const r = await parallel([() => agent('kept'), () => { throw new Error('boom'); }, () => agent('also kept')]);\n"
         "return r;", check=_logs_have("parallel[1] failed: boom")),
    Case("parallel-promises-refused",
         "try { await parallel([agent('eager')]); return 'ran'; } catch (e) { return e.name + ': ' + e.message; }"),
    Case("empty-fanouts", "return {p: await parallel([]), q: await pipeline([], (x) => agent(x))};"),
    Case("pipeline-stage-arguments",
         "return await pipeline(['a', 'b', 'c'], (prev, item, i) => ({prev, item, i}),\n"
         "  (prev, item, i) => ({prev, item, i}));"),
    Case("pipeline-throw-is-null",
         "const seen = [];\n"
         "const r = await pipeline([1, 2, 3], (v) => { if (v === 2) throw new TypeError('bad ' + v); return v * 10; },\n"
         "  (p, item) => { seen.push(item); return p + item; });\nreturn {r, seen};",
         check=_logs_have("pipeline[1] failed: bad 2")),
    Case("pipeline-null-skips-stages",
         "const seen = [];\nconst r = await pipeline(['x', 'y', 'z'], (v) => v === 'x' ? null : v === 'z' ? undefined : v,\n"
         "  (p) => { seen.push(String(p)); return p + '!'; });\nreturn {r, seen};"),
    Case("pipeline-agents", "return await pipeline(['alpha'], (t) => agent('find in ' + t),\n"
                            "  (found, t, i) => agent(`check ${i}: ${found}`));"),
    Case("review-pattern",
         "export const meta = { name: 'review-changes', description: 'review then verify',\n"
         "  phases: [{ title: 'Review' }, { title: 'Verify' }] }\n"
         "const FINDINGS = {type: 'object', properties: {findings: {type: 'array', items: {type: 'object',\n"
         "  properties: {title: {type: 'string'}, file: {type: 'string'}}, required: ['title', 'file']}}},\n"
         "  required: ['findings']};\n"
         "const VERDICT = {type: 'object', properties: {isReal: {type: 'boolean'}}, required: ['isReal']};\n"
         "const DIMENSIONS = [{key: 'bugs', prompt: 'find bugs'}];\n"
         "const results = await pipeline(DIMENSIONS,\n"
         "  (d) => agent(d.prompt, {label: `review:${d.key}`, phase: 'Review', schema: FINDINGS}),\n"
         "  (review) => parallel(review.findings.map((f) => () =>\n"
         "    agent(`Adversarially verify: ${f.title}`, {label: `verify:${f.file}`, phase: 'Verify', schema: VERDICT})\n"
         "      .then((v) => ({...f, verdict: v})))));\n"
         "return { all: results.flat().filter(Boolean), confirmed: results.flat().filter(Boolean).filter((f) => f.verdict?.isReal) };",
         check=_phase_of_labels),
    Case("phase-global-and-option",
         "phase('Scan');\nconst a = await agent('scan it', {label: 'a'});\n"
         "const [b, c] = await parallel([() => agent('fix it', {label: 'b', phase: 'Fix'}), () => agent('more', {label: 'c'})]);\n"
         "phase('Scan');\nconst d = await agent('scan again', {label: 'd'});\nreturn [a, b, c, d];",
         check=_phase_of_labels),
    Case("meta-declared-phases",
         "export const meta = {\n  name: 'lanes', // comments are fine in the literal\n  description: 'declared lanes',\n"
         "  phases: [{ title: 'Scan', detail: 'look' }, { title: 'Fix' }, { title: 'Report', model: 'haiku' }],\n}\n"
         "phase('Scan');\nreturn await agent('only scanning', {label: 's'});", check=_declared_lanes),
    Case("args-verbatim", "args.items.push('added');\nreturn {args, type: typeof args, isArray: Array.isArray(args.items)};",
         args={"items": ["a", "b"], "n": 2, "nested": {"deep": [1, {"x": None}]}}),
    Case("args-absent", "return {type: typeof args, isUndefined: args === undefined};"),
    Case("args-reassigned", "args = (args || 0) + 1;\nreturn args;", args=41),
    Case("budget-shape", alone=True, differs="budget.spent(): Claude Code's counts the whole session's output tokens "
         "(the main session's turns too, before any agent ran); SwarmBase's counts the run's agents only",
         check=_budget_spent, script=
         "const before = budget.spent();\nawait agent('spend a little');\nawait agent('and a bit more');\n"
         "return {total: budget.total, before, after: budget.spent(), infinite: budget.remaining() === Infinity,\n"
         "  kinds: [typeof budget.spent, typeof budget.remaining]};"),
    Case("budget-sizing-idioms",
         "const FLEET = budget.total ? Math.floor(budget.total / 100_000) : 5;\nconst found = [];\n"
         "while (budget.total && budget.remaining() > 50_000) { found.push(await agent('loop')); }\n"
         "const fleet = await parallel(Array.from({length: FLEET}, (_, i) => () => `scout ${i}`));\n"
         "return {FLEET, found, fleet};"),
    Case("workflow-by-name", "const child = await workflow('sub', {topic: 'trio'});\nreturn {child};", needs=("saved-sub",)),
    Case("workflow-unknown-name",
         "try { await workflow('no-such-workflow'); return 'ran'; }\n"
         "catch (e) { return e.message.startsWith(\"workflow('no-such-workflow'): no workflow with that name.\"); }"),
    Case("workflow-script-path", "return await workflow({scriptPath: SCRIPT_FILE}, {topic: 'anyio'});",
         needs=("script-file",)),
    Case("workflow-nesting", "return await workflow('outer');", needs=("saved-sub",),
         differs="nesting depth: Claude Code allows one level of workflow(); SwarmBase allows maxWorkflowDepth (3)",
         check=_nesting),
    Case("return-undefined", "await agent('done before');\nreturn undefined;"),
    Case("return-function", "return () => 1;"),
    Case("top-level-throw", "await agent('before the throw');\nthrow new Error('the script gave up');"),
    Case("console-and-log", "log('one line');\nconsole.log('two', 2);\nconsole.warn('careful');\nreturn 'logged';",
         check=_logs_have("[warn] careful")),
    Case("worktree-isolation",
         "return await parallel([1, 2].map((i) => () => agent(`edit ${i}`, {isolation: 'worktree', label: `w${i}`})));",
         needs=("repo",)),
    Case("call-by-name", "", needs=("saved-sub",), call={"name": "sub", "args": {"topic": "httpx"}}),
    Case("call-by-script-path", "", needs=("script-file",), call={"args": {"topic": "quart"}},
         ),
    Case("call-title-description", "return await agent('labelled run');",
         call={"title": "A title", "description": "What it is for"}),
    Case("clock-refused", "try { return Date.now(); } catch (e) { return e.message; }",
         differs="the clock: Claude Code refuses a script that mentions Date.now(), Math.random() or an argless "
                 "new Date() before it runs; SwarmBase runs it and the call throws where it is made",
         check=_clock),
    # Both ignore an agent() option they do not know (SwarmBase says so in the run log).
    Case("unknown-option", "try { return await agent('plain', {lable: 'typo'}); } catch (e) { return e.message; }"),
    Case("budget-total-target", "return {total: budget.total, infinite: budget.remaining() === Infinity};",
         needs=("target",), differs="budget.total: always null in Claude Code 2.1.328; SwarmBase's is the run's "
                                    "tokenTarget", check=_target),
    Case("meta-optional", "return 'ran';", no_meta=True,
         differs="meta: required by Claude Code, optional in SwarmBase", check=_meta_optional),
    Case("meta-constant", "export const meta = { name: 'constant', description: 'reads its own meta' }\n"
                          "return typeof meta === 'undefined' ? {type: 'undefined'} : {type: typeof meta, name: meta.name};",
         differs="meta inside the script: undefined in Claude Code, the literal as a constant in SwarmBase",
         check=_meta_constant),
    Case("phase-model", "export const meta = { name: 'models', description: 'a phase names its model',\n"
                        "  phases: [{ title: 'Cheap', model: 'haiku' }] }\n"
                        "phase('Cheap');\nreturn await agent('which model [[model]]');",
         differs="phases[].model: recorded but not applied by Claude Code 2.1.328; SwarmBase's default model for "
                 "the phase's agents", check=_phase_model),
    Case("args-null", "return {type: typeof args, isNull: args === null};", args=None,
         differs="args: null reaches the script as undefined in SwarmBase (as no args), as null in Claude Code",
         check=_args_null),
    Case("schema-required-missing",
         "try { return await agent('cannot comply', {schema: {type: 'object', properties: {a: {type: 'string'}},\n"
         "  required: ['b']}}); } catch (e) { return e.message; }",
         differs="a schema requiring an unlisted property: refused before the agent starts in SwarmBase; Claude Code "
                 "starts it and throws when it cannot comply", check=_required_missing),
    Case("display-labels-and-logs",
         "log({x: 1}, 'second');\n"
         "return await agent('an unlabelled agent whose prompt is longer than sixty characters, by far');",
         differs="display only: an unlabelled agent is 'agent N' here (the prompt's first 60 characters in Claude "
                 "Code); log() joins its arguments and JSON-encodes objects (Claude Code logs the first, an object "
                 "as [object])", check=_display),
    Case("timers", "return typeof setTimeout;",
         differs="timers: Claude Code's scripts have setTimeout/clearTimeout; SwarmBase's have no timers",
         check=_timers),
]

# The project's workflows the "saved-sub" cases use: its .claude/workflows/, where both Claude Code and
# SwarmBase find them (Claude Code by meta.name; SwarmBase by file name, then meta.name).
SUB = ("export const meta = { name: 'sub', description: 'a saved child workflow' }\n"
       "const r = await agent('child on ' + args.topic);\nreturn {topic: args.topic, r};\n")
OUTER = ("export const meta = { name: 'outer', description: 'nests another workflow' }\n"
         "try { return {inner: await workflow('deep')}; } catch (e) { return {threw: e.message}; }\n")
DEEP = "export const meta = { name: 'deep', description: 'the grandchild' }\nreturn await agent('deep');\n"
SAVED = {"sub": SUB, "outer": OUTER, "deep": DEEP}
SCRIPT_FILE = ("export const meta = { name: 'from-file', description: 'a script file' }\n"
               "return {fromFile: await agent('file on ' + args.topic)};\n")

# Resume: the first run fails after some agents finished; the resumed run (same script,
# same args) must not run them again and must return what an uninterrupted run returns.
RESUME_SCRIPT = (META + "const a = await agent('resume first');\n"
                 "const b = await parallel([() => agent('resume second'), () => agent('resume third')]);\n"
                 "if (args.fail) throw new Error('stop here');\n"
                 "return {a, b, last: await agent('resume last')};\n")
