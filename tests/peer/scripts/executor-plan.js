export const meta = {
  name: 'executor-plan',
  description: 'Plan a change, have the project executor make each step, review with the project reviewer',
  phases: [{ title: 'Plan' }, { title: 'Execute' }, { title: 'Review' }],
}

// uses the project's agent types (.claude/agents/executor.md, reviewer.md).
const GOAL = typeof args === 'string' ? args : 'add a zero check to div()'

const PLAN = {
  type: 'object',
  properties: {
    steps: {
      type: 'array',
      items: { type: 'object', properties: { file: { enum: ['src/calc.py', 'tests/test_calc.py'] },
        what: { type: 'string' } }, required: ['file', 'what'] },
      maxItems: 2,
    },
  },
  required: ['steps'],
}

phase('Plan')
const plan = await agent(`Plan how to ${GOAL} in src/calc.py. Keep it to two steps.`, { label: 'plan', schema: PLAN })
if (!plan) throw new Error('no plan')

phase('Execute')
const done = []
for (const [i, step] of plan.steps.entries()) {
  const r = await agent(`Step ${i + 1}: ${step.what} (file: ${step.file})`, {
    label: `exec:${i + 1}`,
    agentType: 'executor',
  })
  done.push({ step: i + 1, file: step.file, result: r })
}

phase('Review')
const review = await agent(`Review the change to src/calc.py made for: ${GOAL}`, {
  label: 'review',
  agentType: 'reviewer',
})

return { goal: GOAL, steps: done.length, done, review }
