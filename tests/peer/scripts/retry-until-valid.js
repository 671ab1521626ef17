export const meta = {
  name: 'retry-until-valid',
  description: 'Ask for a rating of each module, asking again (up to three times) while it is not confident',
  phases: [{ title: 'Rate' }, { title: 'Summarize' }],
}

const MODULES = ['src/calc.py', 'src/parse.py', 'src/stub.py']
const MAX_TRIES = 3
const RATING = {
  type: 'object',
  properties: {
    quality: { type: 'integer', minimum: 1, maximum: 5 },
    confident: { type: 'boolean' },
    seen: { type: 'string' },
  },
  required: ['quality', 'confident'],
}

// A retry asks a differently worded question: the same prompt would get the same answer.
async function rate(file) {
  const tries = []
  for (let attempt = 1; attempt <= MAX_TRIES; attempt++) {
    const r = await agent(`Rate the code quality of ${file} from 1 to 5 (attempt ${attempt}).`, {
      label: `rate:${file}:${attempt}`,
      schema: RATING,
    })
    tries.push(r)
    if (r && r.confident) break
  }
  const last = tries[tries.length - 1]
  return { file, tries: tries.length, quality: last ? last.quality : null, confident: !!(last && last.confident) }
}

phase('Rate')
const ratings = await parallel(MODULES.map((file) => () => rate(file)))

phase('Summarize')
const unsure = ratings.filter((r) => r && !r.confident).map((r) => r.file)
const worst = ratings.filter(Boolean).reduce((m, r) => (m === null || r.quality < m.quality ? r : m), null)
const summary = await agent(
  `Summarize: worst module ${worst ? worst.file : 'none'}; unsure about ${unsure.join(', ') || 'nothing'}.`,
  { label: 'summary' },
)
return { ratings, unsure, worst: worst && worst.file, summary }
