export const meta = {
  name: 'fix-stub-worktrees',
  description: 'Try several fixes of the stub, each in its own worktree, then pick one',
  phases: [{ title: 'Attempt' }, { title: 'Judge' }],
}

const TARGET = 'src/stub.py'
const APPROACHES = (args && args.approaches) || ['minimal', 'defensive']

const ATTEMPT = {
  type: 'object',
  properties: {
    summary: { type: 'string' },
    linesChanged: { type: 'integer', minimum: 1, maximum: 30 },
    testsPass: { type: 'boolean' },
    seen: { type: 'string' },
  },
  required: ['summary', 'linesChanged', 'testsPass'],
}

phase('Attempt')
// Each attempt edits its own worktree, so they cannot step on each other.
const attempts = await pipeline(
  APPROACHES,
  (approach, _item, i) =>
    agent(`Implement todo() in ${TARGET} with a ${approach} approach (attempt ${i + 1}). Run the tests.`, {
      label: `attempt:${approach}`,
      isolation: 'worktree',
      schema: ATTEMPT,
    }),
  (a, approach) => (a ? { approach, ...a } : null),
)

const usable = attempts.filter(Boolean)
log(`${usable.length} of ${APPROACHES.length} attempts finished`)
const passing = usable.filter((a) => a.testsPass)

phase('Judge')
let choice = null
if (passing.length > 1) {
  choice = await agent(
    `Pick the better of these fixes of ${TARGET}: ` +
      passing.map((a) => `${a.approach} (${a.linesChanged} lines): ${a.summary}`).join(' | '),
    { label: 'judge' },
  )
} else if (passing.length === 1) {
  choice = passing[0].approach
} else {
  choice = await agent(`No attempt passed its tests; say what blocks a fix of ${TARGET}.`, { label: 'blocker' })
}

return {
  attempted: APPROACHES.length,
  finished: usable.length,
  passed: passing.length,
  smallest: usable.length ? usable.reduce((m, a) => (a.linesChanged < m.linesChanged ? a : m)).approach : null,
  choice,
  seen: usable.map((a) => a.seen),
}
