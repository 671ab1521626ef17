export const meta = {
  name: 'bug-hunt',
  description: 'Hunt for one bug described in a string argument, then confirm it with a worktree repro',
  phases: [{ title: 'Hunt' }, { title: 'Repro' }, { title: 'Report' }],
}

// args: a sentence, e.g. "division by zero crashes"
const SYMPTOM = typeof args === 'string' ? args.trim() : 'something is wrong'
const SUSPECT = {
  type: 'object',
  properties: {
    file: { enum: ['src/calc.py', 'src/parse.py'] },
    fn: { type: 'string' },
    likely: { type: 'boolean' },
    seen: { type: 'string' },
  },
  required: ['file', 'fn', 'likely'],
}

phase('Hunt')
const suspects = await parallel(['src/calc.py', 'src/parse.py'].map((f) => () =>
  agent(`Could "${SYMPTOM}" come from ${f}? Name the function.`, { label: `hunt:${f}`, schema: SUSPECT })))
const likely = suspects.filter((s) => s && s.likely)
log(`${likely.length} likely suspects`)

phase('Repro')
const repros = await pipeline(likely, (s) =>
  agent(`Write a failing test reproducing "${SYMPTOM}" in ${s.fn} of ${s.file}, in tests/test_repro.py.`, {
    label: `repro:${s.file}`,
    isolation: 'worktree',
  }))

phase('Report')
return { symptom: SYMPTOM, suspects, reproduced: repros.filter(Boolean).length }
