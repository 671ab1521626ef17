export const meta = {
  name: 'doc-audit',
  description: 'Check that the docs agree with the code and the project metadata',
  phases: [{ title: 'Read' }, { title: 'Compare' }],
}

const CHECKS = [
  { key: 'version', ask: 'Does the version in pyproject.toml match the newest entry of docs/CHANGES.md?' },
  { key: 'readme', ask: 'Does README.md describe what src/calc.py offers?' },
  { key: 'changes', ask: 'Is every function of src/calc.py mentioned in docs/CHANGES.md?' },
]
const VERDICT = {
  type: 'object',
  properties: { agrees: { type: 'boolean' }, note: { type: 'string' }, seen: { type: 'string' } },
  required: ['agrees', 'note'],
}

phase('Read')
const verdicts = await parallel(CHECKS.map((c) => () => agent(c.ask, { label: `check:${c.key}`, schema: VERDICT })))

phase('Compare')
const failing = CHECKS.filter((c, i) => verdicts[i] && !verdicts[i].agrees).map((c) => c.key)
for (const key of failing) log(`disagrees: ${key}`)
const fixes = failing.length
  ? await agent(`Propose doc fixes for: ${failing.join(', ')} (see docs/CHANGES.md)`, { label: 'fixes' })
  : null
return { verdicts: Object.fromEntries(CHECKS.map((c, i) => [c.key, verdicts[i]])), failing, fixes }
