export const meta = {
  name: 'reviewer-pass',
  description: 'The project reviewer reads each source file; findings are collected per file',
  phases: [{ title: 'Review' }, { title: 'Collect' }],
}

// agentType 'reviewer' is the project's .claude/agents/reviewer.md.
const FILES = ['src/calc.py', 'src/parse.py']
phase('Review')
const notes = await parallel(FILES.map((f) => () =>
  agent(`Review ${f}; report the one most important problem.`, { label: `reviewer:${f}`, agentType: 'reviewer' })))
phase('Collect')
const collected = FILES.map((f, i) => ({ file: f, note: notes[i] }))
log(`${collected.filter((c) => c.note).length} reviews`)
return { collected }
