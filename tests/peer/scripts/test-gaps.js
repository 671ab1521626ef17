export const meta = {
  name: 'test-gaps',
  description: 'For each module, compare it with its tests and list the untested functions',
  phases: [{ title: 'Map' }, { title: 'Gaps' }, { title: 'Write' }],
}

const MODULES = (args && args.modules) || ['calc', 'parse']
const GAPS = {
  type: 'object',
  properties: {
    untested: { type: 'array', items: { type: 'string' }, maxItems: 2 },
    coverage: { type: 'integer', minimum: 0, maximum: 100 },
    seen: { type: 'string' },
  },
  required: ['untested', 'coverage'],
}

phase('Map')
const pairs = MODULES.map((m) => ({ module: m, src: `src/${m}.py`, test: `tests/test_${m}.py` }))
log(`mapping ${pairs.length} modules`)

phase('Gaps')
const gaps = await pipeline(
  pairs,
  (p) => agent(`Which functions of ${p.src} have no test in ${p.test}?`, { label: `gaps:${p.module}`, schema: GAPS }),
  (g, p) => (g ? { ...p, untested: g.untested, coverage: g.coverage, seen: g.seen } : null),
)

phase('Write')
const low = gaps.filter(Boolean).filter((g) => g.coverage < 80)
const drafts = await parallel(
  low.map((g) => () =>
    agent(`Write a pytest test in ${g.test} for ${g.untested[0] || 'the main function'} of ${g.src}.`, {
      label: `write:${g.module}`,
      isolation: 'worktree',
    }),
  ),
)
return {
  modules: MODULES,
  coverage: Object.fromEntries(gaps.filter(Boolean).map((g) => [g.module, g.coverage])),
  drafted: drafts.filter(Boolean).length,
  seen: gaps.filter(Boolean).map((g) => g.seen),
}
