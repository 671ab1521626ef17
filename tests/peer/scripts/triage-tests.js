export const meta = {
  name: 'triage-tests',
  description: 'Triage the failing and flaky tests listed in the notes',
  phases: [{ title: 'Collect' }, { title: 'Classify' }, { title: 'Plan' }],
}

const NOTES = 'notes/triage.txt'
const SUITES = ['tests/test_calc.py', 'tests/test_parse.py']

const CLASS = {
  type: 'object',
  properties: {
    kind: { enum: ['real-bug', 'flaky', 'test-bug', 'fine'] },
    confidence: { type: 'integer', minimum: 1, maximum: 5 },
    seen: { type: 'string' },
  },
  required: ['kind', 'confidence'],
}

phase('Collect')
const notes = await agent(`Read ${NOTES} and list the tests it calls flaky or slow.`, { label: 'notes' })
log('notes read')

phase('Classify')
// One classifier per suite, each reading the suite and the code it tests.
const SOURCE_OF = {
  'tests/test_calc.py': 'src/calc.py',
  'tests/test_parse.py': 'src/parse.py',
}

const classified = await pipeline(
  SUITES,
  (suite) =>
    agent(`Classify the tests in ${suite} against ${SOURCE_OF[suite]}: real bug, flaky, test bug or fine?`, {
      label: `classify:${suite}`,
      schema: CLASS,
    }),
  (c, suite) => {
    if (!c) return null
    return { suite, kind: c.kind, confidence: c.confidence, seen: c.seen }
  },
)

const byKind = {}
for (const c of classified.filter(Boolean)) {
  byKind[c.kind] = (byKind[c.kind] || 0) + 1
}

phase('Plan')
const needsWork = classified.filter(Boolean).filter((c) => c.kind !== 'fine')
const plans = await parallel(
  needsWork.map((c) => () =>
    agent(`Plan a fix for the ${c.kind} in ${c.suite} (confidence ${c.confidence}/5).`, {
      label: `plan:${c.suite}`,
    }),
  ),
)

const lowConfidence = classified.filter(Boolean).filter((c) => c.confidence < 3).map((c) => c.suite)
if (lowConfidence.length) log(`low confidence: ${lowConfidence.join(', ')}`)

return {
  notes,
  byKind,
  plans: plans.map((p, i) => ({ suite: needsWork[i].suite, plan: p })),
  lowConfidence,
  classified,
}
