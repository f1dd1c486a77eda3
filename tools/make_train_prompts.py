"""Generate `specdec/data/train_prompts.jsonl`, the self-distillation corpus for draft heads.

The corpus is built from hand-written templates and topic banks for the same 7 categories as the bench
(`conversation`, `translation`, `summarization`, `qa`, `math`, `rag`, `code`). Summarization and RAG prompts
carry long invented passages (articles, meeting notes, tool documentation, announcements, study reports,
stories; 3-4 numbered retrieved documents). Nothing is copied from a public dataset.

After the generated prompts come the hand-written ones in `tools/written_prompts/<category>.jsonl` (971
prompts added at stop 52: free-form questions, chats, translations, word problems, passages and document sets
that no template produces, because a head trained on templated prompts agreed with the target on 0.38-0.49 of
the held-out test answers' positions in summarisation, qa and retrieval against 0.51-0.68 on its own templated
training prompts). They keep the ids after the generated ones, so a corpus built before them resumes with only
the new prompts to answer.

Output is deterministic: every random choice comes from `random.Random` seeded per category, and the file is
written in a fixed order with ids `train-0001`, `train-0002`, ... Generation fails if any prompt repeats, or
if any prompt matches a bench prompt in `specdec/data/prompts/` (the bench must stay held out).

    python tools/make_train_prompts.py           # rewrite train_prompts.jsonl
    python tools/make_train_prompts.py --check   # exit 1 if the file is not what this script writes
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from specdec.data import bench_prompts

OUTPUT = Path(__file__).resolve().parents[1] / "specdec" / "data" / "train_prompts.jsonl"
WRITTEN = Path(__file__).resolve().parent / "written_prompts"  # hand-written prompts, one file per category
SEED = 1357

# --------------------------------------------------------------------------------------------------------
# conversation
# --------------------------------------------------------------------------------------------------------

HOBBIES = [
    "painting with watercolours", "playing the guitar", "chess", "photography with my phone", "baking bread",
    "knitting", "swimming", "drawing portraits", "writing short stories", "playing the piano",
    "rock climbing", "juggling", "bird watching", "yoga", "long-distance cycling",
]
HOBBY_TEMPLATES = [
    ("I want to get better at {x}. Where should I start?",
     "How much time should I practise each week to notice real progress?"),
    ("I've always wanted to try {x}, but I don't know anyone who does it. Is it hard to learn alone?",
     "What is the most common mistake beginners make, and how can I avoid it?"),
]
TASKS = [
    "keeping my room tidy", "saving money on groceries", "sleeping better at night",
    "making new friends after moving to a new city", "getting up earlier in the morning",
    "keeping a houseplant alive", "writing a cover letter", "spending less time on social media",
    "cooking healthy meals for one person", "typing faster", "keeping a daily journal",
    "asking for a raise at work", "preparing for a long flight", "caring for a new puppy",
    "remembering people's names",
]
TASK_TEMPLATES = [
    ("Do you have any tips for {x}?", "Which of those tips is the most important, and why?"),
    ("I'm struggling with {x}. Can you help me?", "Can you turn your advice into a short plan for this week?"),
]
EVENTS = [
    "a picnic for eight friends", "a surprise party for my sister", "a small family reunion",
    "a weekend camping trip", "an anniversary dinner at home", "the first meeting of a new book club",
    "a bake sale at my child's school", "a neighbourhood clean-up day", "a board game night",
    "a birthday party for a six-year-old",
]
EVENT_TEMPLATES = [
    ("Can you help me plan {x}?", "Can you turn that into a simple checklist with the most important items first?"),
]
WORRIES = [
    "my exams next month", "moving to a new apartment", "starting a new job on Monday",
    "a difficult conversation I need to have with my roommate", "speaking English in meetings at work",
    "my first driving lesson", "a big deadline at work", "meeting my partner's parents for the first time",
    "going to the dentist", "travelling alone for the first time",
]
WORRY_TEMPLATES = [
    ("I'm feeling stressed about {x}. What can I do?", "Can you suggest one small thing I can do today?"),
    ("I keep worrying about {x}. Is that normal?", "How can I stop thinking about it right before I go to sleep?"),
]
REQUESTS = [
    "a few good books for someone who likes mystery novels", "some houseplants that can live in a dark room",
    "a healthy breakfast I can make in five minutes", "a board game for four adults",
    "some podcasts about history", "a short exercise routine I can do at home without equipment",
    "some free ways to spend a Sunday afternoon", "a gift for a coworker who is retiring",
    "a few easy songs to learn on the ukulele", "some snacks to pack for a day of hiking",
]
REQUEST_TEMPLATES = [
    ("Can you recommend {x}?", "Why did you choose the first one, and is there anything to watch out for?"),
]

# --------------------------------------------------------------------------------------------------------
# translation
# --------------------------------------------------------------------------------------------------------

ENGLISH_SENTENCES = [
    "The meeting has been moved to Thursday afternoon because the manager is travelling.",
    "I would like to book a table for four people at seven o'clock tonight.",
    "The children played in the park until it started to rain.",
    "Please send me the report by Friday so that I can read it over the weekend.",
    "Our neighbours have a large dog that barks every morning at six.",
    "How much does a ticket to the city centre cost?",
    "She has been learning to play the violin for three years.",
    "The shop on the corner sells fresh bread and cheese from local farms.",
    "We missed the last bus, so we had to walk home.",
    "Can you recommend a good hotel near the beach?",
    "My brother works as a nurse at the hospital in the city centre.",
    "The concert was cancelled because the singer was ill.",
    "Don't forget to bring your passport and a copy of your booking.",
    "In winter, the lake freezes and people go skating on it.",
    "I'm sorry, but I don't understand. Could you speak more slowly?",
    "The new museum has an exhibition about the history of flight.",
    "We usually have dinner together as a family on Sundays.",
    "The printer on the second floor is out of paper again.",
    "If the weather is good tomorrow, we will go hiking in the mountains.",
    "This soup needs a little more salt and some fresh herbs.",
    "My phone battery is almost empty. Is there somewhere I can charge it?",
    "The teacher asked the students to read the first chapter before the next class.",
    "The flight was delayed by two hours because of fog.",
    "He always drinks a cup of tea before going to bed.",
    "The city is planning to build a new bicycle path along the river.",
    "Excuse me, is this seat free?",
    "I have lived in this town since I was a child.",
    "The doctor told me to rest for a few days.",
    "Our team won the match by three goals to one.",
    "Please turn off the lights when you leave the room.",
]
FOREIGN_SENTENCES = {
    "French": [
        "Je voudrais un café et un croissant, s'il vous plaît.",
        "Le magasin ferme à dix-neuf heures le samedi.",
        "Mon frère habite à Marseille depuis cinq ans.",
        "Il fait très chaud aujourd'hui, alors nous allons à la plage.",
        "Pouvez-vous m'aider à porter cette valise ?",
        "Les enfants ont préparé un gâteau pour l'anniversaire de leur mère.",
        "Le prochain train pour Paris part dans vingt minutes.",
        "J'ai oublié mon parapluie au bureau.",
    ],
    "German": [
        "Ich trinke jeden Morgen eine Tasse Kaffee.",
        "Der Zug nach Berlin hat zwanzig Minuten Verspätung.",
        "Meine Schwester studiert Medizin in München.",
        "Kannst du mir bitte das Salz geben?",
        "Im Sommer fahren wir oft an die Ostsee.",
        "Das Museum ist heute wegen Renovierung geschlossen.",
        "Wir haben am Samstag einen Ausflug in die Berge gemacht.",
        "Ich suche eine Wohnung mit zwei Zimmern in der Nähe des Bahnhofs.",
    ],
    "Spanish": [
        "¿Dónde está la estación de autobuses?",
        "Mi abuelo cuenta historias muy divertidas sobre su juventud.",
        "Hoy hace mucho frío, así que voy a llevar un abrigo.",
        "El mercado abre todos los días a las ocho de la mañana.",
        "Nos gustaría reservar una habitación para dos noches.",
        "Mi hermana aprendió a nadar cuando tenía cinco años.",
        "La película fue muy larga, pero me gustó mucho.",
        "¿Puedes ayudarme con los deberes de matemáticas?",
    ],
}
TRANSLATION_TEMPLATES = [
    "Translate the following {src} text into {tgt}:\n\n{text}",
    "Translate this sentence from {src} to {tgt}: \"{text}\"",
    "How would you say this in {tgt}?\n\n{text}",
    "Please translate into {tgt}:\n{text}",
]

# --------------------------------------------------------------------------------------------------------
# qa
# --------------------------------------------------------------------------------------------------------

QA_CONCEPTS = [
    "gravity", "an atom", "DNA", "a black hole", "electricity", "the immune system", "democracy",
    "a volcano", "renewable energy", "the greenhouse effect", "a food chain", "natural selection",
    "an ecosystem", "a calorie", "compound interest", "supply and demand", "a solar eclipse", "erosion",
    "friction", "a fossil", "the scientific method", "a hypothesis", "a budget deficit", "biodiversity",
]
QA_MECHANISMS = [
    "a bicycle's gears", "a compass", "a microwave oven", "a solar panel", "a thermometer", "a telescope",
    "the human heart", "a battery", "an airplane wing", "a digital camera", "a hot air balloon",
    "GPS navigation", "a touch screen", "a wind turbine", "the human ear", "a dishwasher", "a lighthouse",
    "a pair of glasses",
]
QA_WHY = [
    "do we need to sleep", "does ice float on water", "do cats purr", "is the ocean salty", "do we get hiccups",
    "does bread go stale", "do onions make people cry when they are cut", "do stars twinkle at night",
    "do some birds migrate south for the winter", "do we sweat when we are hot",
    "is regular exercise good for the heart", "does metal feel colder than wood at the same temperature",
    "do some animals hibernate", "do we see lightning before we hear thunder",
    "does a balloon stick to a wall after you rub it on your hair", "do bubbles form in boiling water",
    "do planes sometimes leave white trails in the sky", "does salt melt ice on roads",
]
QA_DIFFERENCES = [
    ("an alligator", "a crocodile"), ("a meteor", "a meteorite"), ("a simile", "a metaphor"),
    ("a herbivore", "a carnivore"), ("a town", "a city"), ("mass", "weight"), ("speed", "velocity"),
    ("an ocean", "a sea"), ("a frog", "a toad"), ("a hurricane", "a tornado"), ("a fruit", "a vegetable"),
    ("an insect", "a spider"), ("a democracy", "a monarchy"), ("a lake", "a river"), ("a noun", "a verb"),
]
QA_PEOPLE = [
    "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "Nelson Mandela", "Charles Darwin",
    "Florence Nightingale", "Galileo Galilei", "Mahatma Gandhi", "Albert Einstein", "Rosalind Franklin",
    "Louis Pasteur", "Amelia Earhart", "Johannes Gutenberg", "Jane Austen", "Wolfgang Amadeus Mozart",
]
QA_ANIMALS = [
    "octopuses", "honeybees", "elephants", "penguins", "dolphins", "owls", "sharks", "camels", "ants",
    "giraffes", "bats", "whales",
]

# --------------------------------------------------------------------------------------------------------
# math
# --------------------------------------------------------------------------------------------------------

PEOPLE = [
    ("Ana", "she"), ("Ben", "he"), ("Chloe", "she"), ("David", "he"), ("Emma", "she"), ("Farid", "he"),
    ("Grace", "she"), ("Hugo", "he"), ("Ines", "she"), ("Jonas", "he"), ("Keiko", "she"), ("Liam", "he"),
    ("Maya", "she"), ("Noah", "he"), ("Olivia", "she"), ("Pablo", "he"), ("Rosa", "she"), ("Tariq", "he"),
]
MATH_SUFFIXES = [
    "Explain your reasoning step by step.",
    "Show each step of your work, then give the final answer.",
    "Think through the problem step by step before answering.",
    "Solve it step by step and write the final answer on the last line.",
]

# --------------------------------------------------------------------------------------------------------
# code
# --------------------------------------------------------------------------------------------------------

CODE_FUNCTIONS = [
    ("reverse_words(sentence)", "returns the sentence with the order of its words reversed"),
    ("is_even(n)", "returns True if the integer n is even and False otherwise"),
    ("factorial(n)", "returns n! using a loop instead of recursion"),
    ("fibonacci(n)", "returns a list with the first n Fibonacci numbers"),
    ("is_prime(n)", "returns True if n is a prime number"),
    ("sum_of_digits(n)", "returns the sum of the digits of a non-negative integer"),
    ("count_words(text)", "returns the number of words in a string"),
    ("capitalize_words(text)", "returns the string with the first letter of every word in upper case"),
    ("remove_duplicates(items)", "returns a new list without duplicates, keeping the original order"),
    ("flatten(nested)", "turns a list of lists into a single flat list"),
    ("max_of_three(a, b, c)", "returns the largest of three numbers without using the built-in max()"),
    ("km_to_miles(km)", "converts a distance in kilometres to miles, rounded to two decimals"),
    ("is_leap_year(year)", "returns True if the year is a leap year in the Gregorian calendar"),
    ("gcd(a, b)", "returns the greatest common divisor of two positive integers using Euclid's algorithm"),
    ("count_char(text, ch)", "counts how many times the character ch appears in text"),
    ("list_product(nums)", "returns the product of all numbers in a list (1 for an empty list)"),
    ("filter_long_words(words, n)", "returns only the words that are longer than n characters"),
    ("char_frequency(text)", "returns a dictionary that maps each letter to how often it appears"),
    ("is_anagram(a, b)", "returns True if the two words use exactly the same letters"),
    ("chunk_list(items, size)", "splits a list into smaller lists of the given size"),
    ("initials(full_name)", "returns the initials of a name, for example 'A.L.' for 'Ada Lovelace'"),
    ("format_minutes(minutes)", "turns a number of minutes into a string such as '2 h 05 min'"),
    ("safe_divide(a, b)", "returns a / b, or None when b is zero"),
    ("count_positive(nums)", "returns how many numbers in a list are greater than zero"),
    ("running_total(nums)", "returns a list where each element is the sum of all elements up to that point"),
    ("longest_word(sentence)", "returns the longest word in a sentence"),
    ("snake_case(text)", "turns a phrase like 'Hello World' into 'hello_world'"),
    ("is_sorted(nums)", "returns True if a list of numbers is sorted in ascending order"),
    ("rotate_list(items, k)", "moves the last k elements of a list to the front"),
    ("digit_name(d)", "returns the English word for a single digit from 0 to 9"),
    ("bmi(weight_kg, height_m)", "computes the body mass index, rounded to one decimal place"),
    ("letter_grade(score)", "returns 'A' for 90-100, 'B' for 80-89, 'C' for 70-79, 'D' for 60-69 and 'F' below"),
    ("common_elements(a, b)", "returns a sorted list of the values that appear in both lists"),
    ("sum_even(nums)", "returns the sum of the even numbers in a list"),
    ("power(base, exp)", "computes base to the power exp with a loop, without using ** or pow()"),
    ("count_lines(path)", "returns the number of non-empty lines in a text file"),
    ("mask_email(email)", "hides part of an email address, turning 'jane@example.com' into 'j***@example.com'"),
    ("invert_dict(d)", "returns a new dictionary with keys and values swapped"),
    ("clamp(x, low, high)", "limits a number to the range from low to high"),
    ("acronym(phrase)", "builds an acronym, for example 'PNG' from 'portable network graphics'"),
]
CODE_FUNCTION_SUFFIXES = [
    "", " Include a short docstring.", " Add two example calls that show how to use it.",
    " Explain how your solution works in a few sentences.",
]
CODE_PROGRAMS = [
    "asks the user for their name and age and prints how old they will be in ten years",
    "prints the multiplication table for the number 7",
    "simulates rolling two dice 1,000 times and prints how often each total appears",
    "reads numbers from the user until they type 'done' and then prints the total",
    "prints all the prime numbers below 50",
    "plays a simple number guessing game where the computer picks a number from 1 to 20",
    "prints a triangle of stars with 5 rows",
    "converts a list of temperatures from Fahrenheit to Celsius and prints them",
    "keeps a shopping list and lets the user add and remove items until they type 'quit'",
    "prints today's date and the day of the week using the datetime module",
    "reads a CSV file with names and scores and prints the name with the highest score",
    "checks whether a password is at least 8 characters long and contains at least one digit",
    "prints the first 10 square numbers",
    "picks a random lunch idea from a list and prints it",
    "counts down from 10 to 1 with a one-second pause between numbers",
]
CODE_EXPLAIN = [
    'for i in range(1, 4):\n    print(i * "*")',
    'names = ["Ana", "Ben", "Cleo"]\nfor index, name in enumerate(names, start=1):\n    print(index, name)',
    "numbers = [4, 1, 3]\nnumbers.sort(reverse=True)\nprint(numbers[0])",
    'text = "hello world"\nprint(text.upper().split())',
    'ages = {"Ana": 31, "Ben": 25}\nfor name, age in ages.items():\n    if age > 30:\n        print(name)',
    'def greet(name="friend"):\n    return f"Hello, {name}!"\n\nprint(greet())\nprint(greet("Sam"))',
    "total = sum(n for n in range(1, 11) if n % 3 == 0)\nprint(total)",
    'pairs = list(zip(["a", "b", "c"], [1, 2, 3]))\nprint(pairs)',
    'word = "banana"\nprint(word.count("a"), word.find("n"), word[::-1])',
    'try:\n    value = int(input("Number: "))\nexcept ValueError:\n    value = 0\nprint(value * 2)',
    "stack = []\nstack.append(1)\nstack.append(2)\nprint(stack.pop(), stack)",
    'import random\n\nrandom.seed(1)\ncards = ["A", "K", "Q"]\nrandom.shuffle(cards)\nprint(cards)',
    "def countdown(n):\n    while n > 0:\n        yield n\n        n -= 1\n\nprint(list(countdown(3)))",
    "matrix = [[1, 2], [3, 4]]\nprint([row[1] for row in matrix])",
    "scores = [70, 85, 90]\nprint(all(s >= 60 for s in scores), any(s > 88 for s in scores))",
]
CODE_BUGS = [
    ("def is_adult(age):\n    if age > 18:\n        return True\n    return False",
     "It should return True for someone who is exactly 18."),
    ("def total_price(prices):\n    for p in prices:\n        total = 0\n        total += p\n    return total",
     "It returns only the last price instead of the sum."),
    ("def last_item(items):\n    return items[len(items)]", "It raises an IndexError."),
    ('names = ["ana", "ben"]\nfor name in names:\n    name = name.capitalize()\nprint(names)',
     "The names are still printed in lower case."),
    ("count = 0\nwhile count < 5:\n    print(count)", "The loop never stops."),
    ("def square(n):\n    print(n * n)\n\nresult = square(4) + 1", "It raises a TypeError."),
    ('x = 10\nif x = 10:\n    print("ten")', "Python reports a SyntaxError."),
    ("def contains(items, target):\n    for item in items:\n        if item == target:\n            return True\n"
     "        else:\n            return False",
     "contains([1, 2, 3], 3) returns False."),
    ("numbers = [2, 4, 6, 7]\nfor n in numbers:\n    if n % 2 == 0:\n        numbers.remove(n)\nprint(numbers)",
     "It should remove every even number but prints [4, 7]."),
    ("def percent(part, whole):\n    return part / whole * 100\n\nprint(percent(5, 0))",
     "It crashes when whole is zero; make it return 0.0 in that case."),
    ('word = "python"\nword[0] = "P"\nprint(word)', "It raises a TypeError."),
    ("def add_numbers(a, b):\nreturn a + b", "Python reports an IndentationError."),
    ('prices = {"apple": 0.5}\nprint(prices["banana"])', "It crashes; it should print 0 for unknown fruit."),
    ('numbers = input("Enter two numbers: ").split()\nprint(numbers[0] + numbers[1])',
     "For the input '2 3' it prints 23 instead of 5."),
    ("def count_up(n):\n    for i in range(n):\n        print(i)\n\ncount_up(5)",
     "It should print the numbers 1 to 5."),
]
CODE_DIFFERENCES = [
    ("a list", "a tuple"), ("==", "is"), ("append()", "extend()"), ("a for loop", "a while loop"),
    ("return", "print()"), ("break", "continue"), ("a dictionary", "a list"), ("list.sort()", "sorted()"),
    ("a local variable", "a global variable"), ("a function", "a method"), ("/", "//"),
    ("remove()", "pop()"), ("str()", "repr()"), ("import math", "from math import sqrt"),
    ("a set", "a list"),
]

# --------------------------------------------------------------------------------------------------------
# summarization passages
# --------------------------------------------------------------------------------------------------------

TOWNS = [
    "Ashwick Vale", "Brookmere", "Cadley Bay", "Dunhollow", "Elmsworth", "Fernhaven", "Glenrook",
    "Harlow Cross", "Ivydale", "Kestrel Ford", "Larchmont Hill", "Millbury", "Northcombe", "Oakhollow",
]
COUNCILLORS = [
    "Sarah Okafor", "Peter Lindqvist", "Amira Haddad", "George Whitlock", "Mei Tanaka", "Daniel Reyes",
    "Fiona MacLeod", "Yusuf Demir", "Claire Dubois", "Tom Ashby", "Priya Raman", "Oliver Grant",
]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
]
# (what, where, purpose, concern, response, caretaker, cost)
PROJECTS = [
    ("a new skate park", "on an empty lot behind the sports hall",
     "give teenagers a safe place to meet and practise",
     "neighbours worried about noise late in the evening",
     "close the park at 9 p.m. and plant a row of trees along the fence", "the town's youth club",
     "95,000 pounds"),
    ("a community orchard", "with forty apple, pear, and plum trees on the edge of Mill Park",
     "provide free fruit for residents and a place for outdoor school lessons",
     "some people were concerned that fallen fruit would attract wasps",
     "organise monthly picking days so that fruit is collected before it falls",
     "a group of volunteer gardeners", "18,000 pounds"),
    ("a monthly repair cafe", "in the old fire station on the first Saturday of each month",
     "help people fix broken lamps, bicycles, clothes, and small electronics instead of throwing them away",
     "local repair shops feared losing customers",
     "invite the shops to run stalls and advertise their services at each event",
     "a local environmental charity", "6,500 pounds"),
    ("a bike-sharing scheme", "with 150 bicycles at 20 stations around the town centre",
     "reduce car traffic and make short trips cheaper",
     "shop owners worried that the stations would take up parking spaces",
     "place most stations on wide pavements instead of in parking bays",
     "a private operator under contract with the council", "420,000 pounds"),
    ("a rooftop vegetable garden", "on top of the multi-storey car park in the town centre",
     "grow fresh vegetables for the local food bank",
     "engineers questioned whether the roof could carry the weight of wet soil",
     "use lightweight raised beds and limit the garden to one half of the roof",
     "the food bank and a team of volunteers", "64,000 pounds"),
    ("a new footbridge over the river", "linking the eastern housing estate to the railway station",
     "cut the walk to the station from twenty-five minutes to about eight",
     "residents near the river worried about losing several old willow trees",
     "plant three new trees for every tree that is removed", "the council's highways department",
     "2.3 million pounds"),
    ("a tool library", "in a converted shipping container next to the town hall",
     "let residents borrow ladders, drills, and garden tools instead of buying them",
     "organisers were unsure whether people would return the tools on time",
     "introduce a simple online booking system with reminder messages", "a team of retired volunteers",
     "22,000 pounds"),
    ("a free late-night bus service",
     "running every thirty minutes between the outlying villages and the town centre until midnight",
     "help young people and shift workers travel home safely",
     "some councillors doubted that enough people would use the buses",
     "review passenger numbers after six months and adjust the timetable", "the regional bus company",
     "310,000 pounds a year"),
    ("a renovated public swimming pool", "with a new roof, solar water heating, and a separate learners' pool",
     "restart swimming lessons for every primary school in the area",
     "regular swimmers were unhappy that the pool would be closed for over a year",
     "arrange free bus trips to a pool in a neighbouring town during the work", "the town's leisure trust",
     "3.1 million pounds"),
    ("a redesigned market square", "where the old car park will be replaced by trees, benches, and a fountain",
     "create a pleasant space for markets, concerts, and outdoor events",
     "some drivers complained about losing sixty parking spaces",
     "add extra spaces to the car park behind the library", "the council's parks team",
     "1.4 million pounds"),
    ("a community fridge", "in the entrance hall of the public library",
     "let shops and households share surplus food instead of wasting it",
     "people asked how anyone would make sure the food stayed safe to eat",
     "train volunteers to check dates and clean the fridge every day",
     "volunteers from the library and two local cafes", "4,000 pounds"),
    ("an inclusive playground", "in the centre of Victoria Park, designed for children with and without disabilities",
     "give every child in the town a place to play together",
     "parents asked whether the rubber surface would become too hot in summer",
     "add shade sails over the play equipment", "the parks team and a parents' group", "260,000 pounds"),
]
FUNDERS = [
    "a national lottery grant", "a regional development fund", "the council's own budget",
    "a local business association", "a charitable foundation", "a government grant for green projects",
]
QUOTES = [
    "We listened to what people told us they wanted, and this was at the top of the list.",
    "Small projects like this make a real difference to everyday life in a town.",
    "It has taken a lot of work, but we think residents will be proud of the result.",
    "This is a project for everyone, and we hope people of all ages will use it.",
]
CLOSINGS = [
    "If the project is a success, the council says it may try similar ideas in other parts of the town.",
    "Local schools have already asked whether classes can visit once it opens.",
    "An opening celebration with music and free refreshments is planned for the first weekend.",
    "The council will publish a short progress report every three months.",
]

TEAMS = [
    ("Marketing team", ["Nadia (team lead)", "Chris (social media)", "Ravi (design)", "Helen (events)"]),
    ("Customer support team", ["Jonas (manager)", "Aisha (support)", "Kevin (support)", "Marta (training)"]),
    ("Website team", ["Lucia (product)", "Ben (front end)", "Sanjay (back end)", "Eva (testing)"]),
    ("School parents' association", ["Ruth (chair)", "Mohammed (treasurer)", "Lena (secretary)", "Paul (events)"]),
    ("Warehouse operations team", ["Grace (manager)", "Igor (shift lead)", "Tomasz (safety)", "June (planning)"]),
    ("Community garden committee", ["Alan (chair)", "Bea (treasurer)", "Chen (volunteers)", "Dora (plants)"]),
    ("Finance team", ["Victor (head)", "Sofia (payroll)", "Henry (accounts)", "Amal (reporting)"]),
    ("Youth football club board", ["Carlos (chair)", "Nina (coaching)", "Frank (kit)", "Zoe (fundraising)"]),
    ("Library staff", ["Irene (head librarian)", "Oscar (children's)", "Pia (digital)", "Sam (front desk)"]),
    ("Research lab group", ["Dr. Wu (lead)", "Maria (postdoc)", "Tim (student)", "Jana (technician)"]),
    ("Restaurant kitchen team", ["Marco (head chef)", "Leila (sous chef)", "Ed (pastry)", "Rin (front of house)"]),
    ("Hospital ward nursing team", ["Agnes (ward manager)", "Dev (nurse)", "Kate (nurse)", "Luis (admin)"]),
    ("Theatre group", ["Olga (director)", "Pete (stage)", "Quinn (costumes)", "Ruby (tickets)"]),
    ("IT helpdesk", ["Stefan (lead)", "Tara (support)", "Umar (networks)", "Vera (hardware)"]),
]
PURCHASES = [
    "new laptops", "a second printer", "new office chairs", "a larger storage shelf", "new software licences",
]
ROLES = ["part-time assistant", "project coordinator", "trainee", "volunteer coordinator", "technician"]
FEATURES = [
    "clearer opening hours on the website", "an option to pay by card", "shorter waiting times",
    "more evening appointments", "a printed monthly newsletter", "better signs in the building",
]
DELAY_REASONS = [
    ("the spring newsletter", "two people were off sick", "ask a volunteer to help with proofreading"),
    ("the new booking system",
     "the supplier sent the wrong version",
     "keep the old system running for another month"),
    ("the storage room clear-out", "the skip was delivered late", "finish the work on the next free Saturday"),
    ("the annual report", "some figures arrived late", "publish it in two parts"),
    ("the volunteer handbook", "the legal check took longer than expected", "send out a short summary first"),
]
TRAINING_TOPICS = [
    "first aid", "handling difficult phone calls", "the new booking software", "fire safety", "data protection",
]
TEAM_EVENTS = ["an open day", "a summer barbecue", "a charity quiz night", "a thank-you lunch for volunteers"]
PROPOSALS = [
    ("moving the weekly meeting from Monday to Wednesday", "people who work part-time on Wednesdays"),
    ("sharing the meeting notes online instead of by email", "members who are not comfortable with new tools"),
    ("a shared calendar for holiday requests", "privacy, since everyone could see who is away"),
    ("a short daily check-in at 9:15", "whether it would take too much time out of busy mornings"),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]

# (name, kind, purpose, command, command_note, option, option_note, default, output, problem)
TOOLS = [
    ("notejar", "command-line notebook", "stores short notes in a single text file so they can be searched later",
     "notejar add \"Call the plumber on Friday\"", "Each note is saved with the date and time it was added.",
     "--tag",
     "attaches a label such as work or home, which can be used to filter notes",
     "notes are stored in notejar.txt in your home folder",
     "notejar list prints all notes, newest first, and notejar find WORD shows only notes that contain a word",
     "If two computers share the same notes file through a sync service, edits made at the same moment can be lost"),
    ("pixshrink", "image compression tool",
     "makes photos smaller so they are faster to upload and take less disk space",
     "pixshrink holiday.jpg",
     "This creates holiday-small.jpg next to the original and never changes the original file.",
     "--quality",
     "sets a value from 1 to 100; lower values give smaller files but more visible blur",
     "the quality is 80",
     "After each file, pixshrink prints the old size, the new size, and the percentage saved",
     "Very large panorama images may need several minutes and a lot of memory"),
    ("tallyup", "personal expense tracker", "records what you spend and shows totals by category and by month",
     "tallyup add 12.50 food \"lunch with Sam\"",
     "The amount comes first, then the category, then an optional description.",
     "--month", "limits reports to a single month, written as 2024-05", "reports cover the current month",
     "tallyup report prints a table of categories with their totals and a simple bar chart made of text characters",
     "Amounts must use a dot as the decimal separator, so 12,50 is rejected"),
    ("csvpeek", "viewer for CSV files",
     "shows the first rows of a large spreadsheet file without opening a spreadsheet program",
     "csvpeek sales.csv", "This prints the column names and the first 20 rows in neat columns.",
     "--rows", "changes how many rows are shown", "20 rows are shown",
     "csvpeek also prints the number of rows and columns at the bottom, and --stats adds the minimum, maximum, "
     "and average of every numeric column",
     "Files that use semicolons instead of commas need the --sep ';' option"),
    ("wordwise", "writing helper",
     "checks a text file for very long sentences, repeated words, and common spelling mistakes",
     "wordwise essay.txt", "Each problem is listed with its line number and a short suggestion.",
     "--max-words",
     "sets how many words a sentence may have before it is reported as too long",
     "the limit is 30 words",
     "A summary at the end counts the problems of each type and gives an overall reading level",
     "wordwise only understands English and does not check grammar in detail"),
    ("sitepulse", "website monitor",
     "checks every few minutes whether your websites are online and how fast they respond",
     "sitepulse watch https://example.org", "The check runs in the background until you stop it with Ctrl+C.",
     "--every", "sets the time between checks in minutes", "sites are checked every 5 minutes",
     "Results are written to sitepulse.log, and a warning is printed when a site is down or takes longer than "
     "three seconds to respond",
     "Some websites block automated checks, and these will wrongly appear as offline"),
    ("packmate", "packing list generator",
     "creates a checklist of things to pack based on the length and type of a trip",
     "packmate --days 5 --type beach", "The list is printed grouped into clothes, toiletries, documents, and extras.",
     "--people", "multiplies clothing items for the number of travellers", "the list is for one person",
     "Lists can be saved as a text file with --save, and items can be ticked off later with packmate check",
     "The weather is not checked automatically, so add warm clothes yourself if the forecast is cold"),
    ("timebox", "focus timer", "splits work into blocks of concentrated time followed by short breaks",
     "timebox start", "A 25-minute work block begins, followed by a 5-minute break.",
     "--work", "changes the length of the work blocks in minutes", "work blocks last 25 minutes",
     "At the end of the day, timebox stats shows how many blocks were completed and the total focused time",
     "The sound alert does not work on some older computers, so a message is also shown on the screen"),
    ("recipebox", "recipe organiser",
     "keeps recipes in one folder and can scale ingredient amounts for more or fewer people",
     "recipebox show pancakes --serves 6", "The ingredient amounts are recalculated for six people.",
     "--metric",
     "converts cups and ounces into grams and millilitres",
     "recipes are shown in the units they were written in",
     "recipebox search can find recipes by ingredient, for example every recipe that uses spinach",
     "Amounts like 'a pinch' or 'to taste' are not scaled"),
    ("quizforge", "flashcard tool", "helps you learn vocabulary or facts by asking questions from a simple text file",
     "quizforge study spanish.txt", "Each line of the file holds a question and an answer separated by a tab.",
     "--shuffle", "asks the questions in random order", "questions are asked in the order of the file",
     "Cards you answer wrongly are asked again at the end of the session, and your score is saved for next time",
     "Answers must match exactly, so quizforge may mark an answer wrong because of a missing accent"),
    ("dupfinder", "duplicate file finder",
     "searches a folder for files with identical content so that you can free up disk space",
     "dupfinder ~/Pictures", "Groups of identical files are listed together with their sizes.",
     "--delete", "asks which copy to keep and moves the others to the trash", "nothing is deleted",
     "A final line reports how much space could be saved by removing the duplicates",
     "Scanning a very large folder for the first time can take several minutes"),
    ("habitgrid", "habit tracker", "shows a grid of days so you can see how often you kept up a habit",
     "habitgrid done reading", "This marks today as done for the habit called reading.",
     "--weeks", "sets how many weeks of history the grid shows", "the grid shows the last 8 weeks",
     "habitgrid show prints each habit as a row of filled and empty squares and the current streak",
     "Days are counted in your computer's time zone, which can cause confusion when travelling"),
]

# (sender, audience, subject, [three changes], contact)
ANNOUNCEMENTS = [
    ("Greenway Fitness Centre", "members", "Changes to opening hours and classes",
     ["From 1 September, the centre will open at 6:00 instead of 7:00 on weekdays, because many members asked for "
      "early sessions before work.",
      "The Friday evening spin class will move to Saturday morning at 9:30, and a new beginners' strength class "
      "will start on Tuesdays at 18:00.",
      "The sauna will close for repairs for two weeks in September; members will receive a small discount on "
      "their October fee."],
     "the reception desk"),
    ("Hillside Primary School", "parents and carers", "New arrangements for school pick-up",
     ["From next Monday, the main gate will be used only for pick-up of Years 1 to 3, while older children will "
      "leave through the side gate on Park Lane.",
      "Children in the after-school club must be collected from the hall by 17:30 at the latest, and late "
      "collections will be recorded.",
      "Parents are asked not to park in the staff car park, as this has caused dangerous situations at busy times."],
     "the school office"),
    ("Riverbank Library", "library users", "Our new self-service system",
     ["From 3 March, books can be borrowed and returned at four new self-service machines near the entrance.",
      "Library staff will still be available at the help desk for questions, printing, and membership cards, but "
      "the borrowing counter will be removed.",
      "A short training session on using the machines will be held every morning at 10:30 during the first two "
      "weeks."],
     "any member of staff"),
    ("Northgate Software Ltd", "all staff", "Changes to the IT security rules",
     ["From next month, every employee must use two-step login for email and the company file store.",
      "Passwords will no longer have to be changed every 90 days, but they must be at least 14 characters long.",
      "Laptops that have not received updates for more than 30 days will be blocked from the company network "
      "until they are updated."],
     "the IT helpdesk"),
    ("Maple Court Residents' Association", "residents", "New rules for the shared garden",
     ["Barbecues will be allowed in the garden only on the stone patio and must be finished by 22:00.",
      "A rota will be introduced so that each flat helps with watering for one week during the summer.",
      "Children's toys must be put away in the new storage box each evening so that the lawn can be mowed."],
     "the association's secretary"),
    ("City Bus Company", "passengers", "Timetable changes on route 12",
     ["From 1 June, buses on route 12 will run every 10 minutes during the morning rush hour instead of every 15 "
      "minutes.",
      "The stop outside the old post office will close permanently, and a new stop will open 200 metres away near "
      "the health centre.",
      "Evening services after 20:00 will run every 30 minutes, and the last bus will leave the city centre at "
      "23:40."],
     "the customer service line"),
    ("Eastside Community Centre", "visitors and group leaders", "Room bookings and fees",
     ["From January, rooms can be booked online up to three months in advance instead of only by phone.",
      "The hourly fee for the large hall will rise from 20 to 24 euros, while the small meeting rooms stay at 10 "
      "euros.",
      "Groups that cancel less than 48 hours before their booking will be charged half of the fee."],
     "the centre manager"),
    ("Blue Harbour Cafe", "customers", "Changes to our menu and loyalty card",
     ["We are adding three vegan lunch dishes and a gluten-free cake every day from next week.",
      "Our paper loyalty card is being replaced by a free app; stamps already collected can be moved to the app "
      "at the counter.",
      "Customers who bring their own cup will now receive 30 cents off any hot drink."],
     "our staff at the counter"),
    ("Westfield Youth Orchestra", "members and parents", "Rehearsal schedule for the spring term",
     ["Rehearsals will move from the school hall to the music college on Station Road, which has better parking.",
      "Rehearsals will start at 17:00 instead of 17:30 and finish at 19:00, with a short break at 18:00.",
      "The spring concert will take place on 12 April, and every member should keep the afternoon free for the "
      "final rehearsal."],
     "the orchestra manager"),
    ("Sunnyvale Medical Practice", "patients", "Booking appointments",
     ["From next month, most appointments can be booked through the practice website as well as by phone.",
      "The phone line will open at 8:00 for urgent same-day appointments, and routine appointments should be "
      "booked online or after 10:00.",
      "Patients who cannot attend an appointment are asked to cancel it at least 24 hours in advance so it can be "
      "offered to someone else."],
     "the reception team"),
]

# (title, who, size, length, method, finding, detail, surprise, limitation, next_step)
STUDIES = [
    ("Plants in the office and workers' concentration", "office workers at two insurance companies", "86",
     "three months",
     "half of the desks received two potted plants, while the other desks stayed as they were",
     "workers with plants scored about 8 percent higher on a short concentration test",
     "they also rated their office as more pleasant and less noisy",
     "the effect was largest in rooms without windows",
     "the workers knew they were part of a study, which may have affected their answers",
     "test whether the effect lasts for a whole year"),
    ("Walking to school and morning alertness", "pupils aged 10 to 12", "240", "one school term",
     "children who walked or cycled to school were compared with children who arrived by car or bus",
     "children who walked or cycled felt more awake during the first lesson",
     "teachers noticed fewer children asking for breaks in the morning",
     "even a walk of ten minutes seemed to make a difference",
     "families who walk may differ in other ways, such as bedtimes and breakfast habits",
     "run a trial in which some classes start the day with a short outdoor walk"),
    ("Smaller plates and food waste in a university canteen", "diners at a university canteen", "about 3,000",
     "eight weeks",
     "the canteen replaced its large plates with slightly smaller ones for four weeks and then switched back",
     "food waste fell by about 20 percent while the smaller plates were in use",
     "diners did not report feeling less full",
     "some students simply went back for a second serving",
     "the study took place in one canteen, so the results may not apply elsewhere",
     "try the same change in school and hospital kitchens"),
    ("Reading aloud to dogs and children's reading confidence", "children aged 7 and 8", "60", "ten weeks",
     "children read aloud to a calm, trained dog for fifteen minutes each week in the school library",
     "the children's reading confidence, measured with a questionnaire, rose clearly",
     "their reading speed improved slightly more than that of a comparison group",
     "shy children benefited the most",
     "the group was small and the dogs were only available at one school",
     "repeat the study with more schools and a longer period"),
    ("Phone-free lunch breaks", "employees at a logistics company", "150", "six weeks",
     "some teams agreed to leave their phones in their lockers during lunch",
     "these employees reported feeling more relaxed in the afternoon",
     "they also talked more with colleagues from other departments",
     "several people chose to keep the habit after the study ended",
     "the teams chose themselves whether to take part, so they may have been more motivated",
     "study whether the change affects sick days over a longer period"),
    ("Street lighting and evening cycling", "residents of a medium-sized town", "about 1,200", "one year",
     "the town installed brighter LED lights on half of its cycle paths and counted cyclists on all paths",
     "the number of cyclists in the evening rose by about a quarter on the newly lit paths",
     "more women reported feeling safe cycling after dark",
     "the new lights also used less electricity than the old ones",
     "the year had an unusually mild winter, which may have encouraged cycling",
     "look at the effect on cycling accidents"),
    ("Music during homework", "secondary school students", "120", "four weeks",
     "students did short maths exercises in silence, with instrumental music, and with songs that had lyrics",
     "students made the fewest mistakes in silence and with instrumental music",
     "songs with lyrics led to more mistakes and slower work",
     "many students believed that music with lyrics helped them, even when their results were worse",
     "the exercises were short and may not reflect longer homework sessions",
     "test longer tasks such as essay writing"),
    ("Community gardening and loneliness in older adults", "adults over 65", "90", "six months",
     "half of the participants joined a weekly gardening group while the others continued as usual",
     "gardeners reported feeling less lonely at the end of the study",
     "they also walked more on the days of the group",
     "the friendships formed in the group often continued outside it",
     "people who dropped out were not followed up",
     "compare gardening with other group activities such as choirs"),
    ("Shorter meetings and productivity", "teams at a design agency", "12 teams", "two months",
     "half of the teams limited all meetings to 25 minutes and required a written agenda",
     "these teams spent about three fewer hours per week in meetings",
     "they finished slightly more tasks on time",
     "people said meetings felt more focused, even though some topics had to be moved to email",
     "productivity was measured by the teams' own task lists",
     "check whether the change affects the quality of the work"),
    ("Breakfast clubs and school attendance", "primary schools in one region", "18 schools", "two school years",
     "nine schools opened free breakfast clubs before lessons, while nine similar schools did not",
     "attendance rose by about two percent in schools with a breakfast club",
     "the number of children arriving late fell even more",
     "teachers reported calmer classrooms in the first lesson",
     "the schools were not chosen at random",
     "measure whether there is an effect on reading and maths results"),
    ("Water refill stations and plastic bottle sales", "visitors to a city park", "about 50,000", "one summer",
     "the park installed six free water refill stations and tracked bottled water sales at its kiosks",
     "sales of bottled water fell by about 30 percent compared with the previous summer",
     "the refill stations were used most on hot afternoons",
     "children used the stations more than adults",
     "the summer was cooler than the year before, which could also reduce sales",
     "add signs showing where the nearest station is and measure the effect"),
    ("Short naps and afternoon performance", "night-shift nurses", "48", "one month",
     "nurses were allowed a 20-minute nap during their break on some shifts but not on others",
     "after a nap, nurses made fewer errors on a short attention test",
     "they also reported feeling less tired on the drive home",
     "naps longer than 30 minutes made people feel groggy",
     "finding a quiet place to nap was difficult on busy wards",
     "test whether quiet rest rooms make naps easier to take"),
]

# (name, pronoun, setting, goal, problem, attempt, helper, resolution, ending)
STORIES = [
    ("Mara", "she", "a small fishing village", "win the village's annual boat race",
     "a storm damaged her old boat two days before the race",
     "she worked through the night to patch the hull, but the repairs were not finished by morning",
     "her grandfather, who had not sailed in years,",
     "helped her fix the sail and they launched the boat just in time",
     "She finished third, but she said it felt like winning because she had sailed with her grandfather."),
    ("Theo", "he", "a busy city apartment building", "find out who kept leaving flowers outside his door",
     "none of his neighbours admitted to leaving them",
     "he got up before dawn one morning to watch the hallway, but fell asleep on the sofa",
     "the building's caretaker",
     "explained that an elderly neighbour had been thanking Theo for carrying her shopping",
     "Theo knocked on her door the next day, and they now have tea together every Sunday."),
    ("Priya", "she", "a mountain town", "open a small bookshop in an empty building on the main street",
     "the bank refused to lend her the money she needed",
     "she tried selling books at the weekly market to prove that people would buy them",
     "a group of regular customers", "offered to lend her money in return for free coffee for a year",
     "The shop opened in the spring, and the customers' names are painted on a sign above the door."),
    ("Jonah", "he", "a farm at the edge of a forest", "save a lost fox cub he found in the barn",
     "the cub would not eat any of the food he offered",
     "he tried milk, bread, and even his own sandwich",
     "a wildlife rescuer from the nearby town", "showed him how to feed the cub and kept it safe until it was strong",
     "Weeks later, Jonah watched the young fox run back into the forest."),
    ("Lina", "she", "a school with a tiny music room", "form a band with her classmates for the end-of-year concert",
     "nobody in the group could play the drums",
     "she tried to learn herself from videos but kept losing the rhythm",
     "the quiet new boy in her class", "turned out to be an excellent drummer who had been too shy to offer",
     "The band played two songs at the concert, and the new boy got the loudest applause."),
    ("Omar", "he", "a desert town", "repair the town's broken clock tower before the spring festival",
     "no one knew where to find the missing gear wheel",
     "he searched the old workshop and the town's rubbish heap",
     "a retired teacher", "remembered that the gear had been kept in the museum for safekeeping decades ago",
     "On the morning of the festival, the clock struck twelve for the first time in twenty years."),
    ("Elsa", "she", "a snowy island", "deliver medicine to a sick neighbour across the frozen bay",
     "the ice looked too thin to cross safely",
     "she considered waiting for the ferry, which was not due for three days",
     "her older brother", "suggested taking the long path around the bay with the dog sled",
     "They arrived after dark, and the neighbour recovered within a week."),
    ("Kofi", "he", "a crowded market town", "sell enough of his handmade baskets to pay for a school trip",
     "heavy rain kept customers away from the market all week",
     "he moved his stall under a bridge, but few people passed by",
     "a cafe owner", "let him display the baskets in her shop window",
     "By Friday, every basket was sold, and the cafe owner ordered ten more for her tables."),
    ("Nell", "she", "a quiet seaside town", "teach her grandmother to use a video call to talk to relatives abroad",
     "her grandmother was afraid of pressing the wrong button",
     "Nell wrote instructions on paper, but the writing was too small to read",
     "her younger brother", "drew large, colourful pictures of each step",
     "That weekend, her grandmother made her first video call and talked for two hours."),
    ("Felix", "he", "a village in the hills", "rebuild a stone wall that had fallen during the winter",
     "the stones were heavier than he expected",
     "he tried moving them alone with a wheelbarrow and hurt his back",
     "three neighbours", "came with a small tractor and spent a Saturday helping him",
     "When the wall was finished, they celebrated with a picnic on top of it."),
    ("Rosa", "she", "a large city hospital", "finish her first week as a nurse without making a mistake",
     "on the third day she mixed up two patients' lunch orders",
     "she felt embarrassed and considered hiding the mistake",
     "an experienced nurse", "told her that everyone makes small mistakes and that honesty matters most",
     "Rosa apologised to the patients, who laughed and said the food was good anyway."),
    ("Arjun", "he", "a suburb with a small park", "build a bird box that birds would actually use",
     "his first box stayed empty for a whole month",
     "he moved it to a different tree, but still no birds came",
     "a neighbour who watched birds",
     "explained that the entrance hole was too large and the box faced the midday sun",
     "Arjun built a new box, and a pair of blue tits moved in the following spring."),
]

SUMMARY_INSTRUCTIONS = [
    "Summarize the text above in three sentences.",
    "Write a one-paragraph summary of the text above.",
    "Summarize the main points of the text above as a bulleted list.",
    "Give a short summary of the text above for someone who has not read it.",
    "What are the most important points in the text above? Summarize them briefly.",
    "Summarize the text above in about 50 words.",
    "Write a two-sentence summary of the text above, then list the most important dates or numbers.",
]
SUMMARY_LEADS = [
    "Read the following text and summarize it in three sentences.",
    "Summarize the following text in a short paragraph.",
    "Please write a brief summary of this text.",
]

# --------------------------------------------------------------------------------------------------------
# rag
# --------------------------------------------------------------------------------------------------------

RAG_HEADERS = ["Retrieved documents:", "Documents:", "Search results:"]
RAG_INSTRUCTIONS = [
    "Answer the question using only the documents above. Quote the sentences that support your answer and "
    "give their document numbers.",
    "Using the retrieved documents, answer the question. Include direct quotes from the documents as "
    "evidence.",
    "Answer based only on these documents. When you use information from a document, quote it and cite it "
    "as [n].",
]
GYMS = [
    "FitZone", "Peak Performance Gym", "The Iron Works", "Riverside Fitness", "CoreMotion",
    "Summit Health Club", "Pulse Athletic", "GreenLeaf Gym", "Harbour Fitness", "Uptown Strength",
    "Northside Leisure",
]
HOTELS = [
    "Hotel Bellavista", "The Old Mill Inn", "Seaview Lodge", "Hotel Lindenhof", "The Grey Heron",
    "Parkside Suites", "Casa del Sol", "The Alpine Rest", "Harbour Lights Hotel", "The Willow House",
    "Hotel Meridian",
]
PACKAGES = [
    "tinyqueue", "pathkit", "slugify-lite", "dateparse2", "loglite", "minicache", "jsonguard", "retryable",
    "textstats", "easyplot", "cronish",
]
RAIL_COMPANIES = [
    "Coastline Rail", "Valley Express", "Metro North Buses", "Lakeside Trains", "Highland Coaches",
    "Blue Arrow Rail", "Southern Link", "Riverside Transit", "Capital Commuter", "Green Valley Buses",
    "Westway Rail",
]
COURSES = [
    ("Beginner Pottery", "Oakfield Arts Centre"), ("Conversational Italian", "Linden Language School"),
    ("Introduction to Python", "Harbour Community College"), ("Watercolour Landscapes", "The Studio Collective"),
    ("First Aid for Parents", "Red Oak Training"), ("Digital Photography", "Northgate Adult Education"),
    ("Bookkeeping Basics", "City Business School"), ("Creative Writing", "Riverside Library"),
    ("Beginner Guitar", "Westside Music House"), ("Sign Language Level 1", "Bridge Learning Centre"),
    ("Bread Baking", "The Village Kitchen"),
]
APPLIANCES = [
    ("AeroBrew 300", "coffee machine", "water tank"), ("CleanSweep V8", "cordless vacuum cleaner", "dust container"),
    ("FreshAir Mini", "air purifier", "filter"), ("CrispMaster", "air fryer", "basket"),
    ("SilkPress Pro", "steam iron", "water tank"), ("BlendGo", "portable blender", "blade unit"),
    ("QuietBreeze", "desk fan", "front grille"), ("ToastMate Duo", "toaster", "crumb tray"),
    ("HydroMist", "humidifier", "water tank"), ("ChillBox 20", "mini fridge", "drip tray"),
    ("PureKettle 2", "electric kettle", "limescale filter"),
]
FESTIVALS = [
    "Lakeside Folk Festival", "Harvest Lights Fair", "Northern Jazz Weekend", "Riverside Food Festival",
    "Summer Kite Festival", "Old Town Book Fair", "Green Fields Music Festival", "Hilltop Film Nights",
    "Seaside Sand Sculpture Festival", "Winter Lantern Parade", "Meadow Family Fun Day",
]
COWORKING = [
    "The Hive", "Workbench Commons", "Studio Nine", "The Desk Club", "Union Street Offices", "Lighthouse Works",
    "The Common Room", "Maker's Loft", "Parkview Workspace", "The Foundry", "Canal Side Desks",
]


# --------------------------------------------------------------------------------------------------------
# builders
# --------------------------------------------------------------------------------------------------------


def _conversation(r: random.Random) -> list[dict]:
    groups = [
        (HOBBIES, HOBBY_TEMPLATES), (TASKS, TASK_TEMPLATES), (EVENTS, EVENT_TEMPLATES),
        (WORRIES, WORRY_TEMPLATES), (REQUESTS, REQUEST_TEMPLATES),
    ]
    out = []
    for topics, templates in groups:
        for template in templates:
            for topic in topics:
                first, second = template[0].format(x=topic), template[1]
                out.append({"prompt": first, "turns": [first, second]})
    r.shuffle(out)
    return out


def _translation(r: random.Random) -> list[dict]:
    out = []
    for i, text in enumerate(ENGLISH_SENTENCES):
        for j, tgt in enumerate(("French", "German", "Spanish")):
            template = TRANSLATION_TEMPLATES[(i + j) % len(TRANSLATION_TEMPLATES)]
            out.append({"prompt": template.format(src="English", tgt=tgt, text=text)})
    for src, sentences in FOREIGN_SENTENCES.items():
        for i, text in enumerate(sentences):
            template = TRANSLATION_TEMPLATES[i % len(TRANSLATION_TEMPLATES)]
            out.append({"prompt": template.format(src=src, tgt="English", text=text)})
    r.shuffle(out)
    return out


def _qa(r: random.Random) -> list[dict]:
    prompts = []
    concept_forms = ["What is {x}? Explain it in simple terms.", "Can you explain what {x} is to a ten-year-old?"]
    prompts += [concept_forms[i % 2].format(x=x) for i, x in enumerate(QA_CONCEPTS)]
    prompts += [f"How does {x} work?" for x in QA_MECHANISMS]
    prompts += [f"Why {x}?" for x in QA_WHY]
    prompts += [f"What is the difference between {a} and {b}?" for a, b in QA_DIFFERENCES]
    prompts += [f"Who was {x}, and what is this person best known for?" for x in QA_PEOPLE]
    prompts += [f"What are three interesting facts about {x}?" for x in QA_ANIMALS]
    r.shuffle(prompts)
    return [{"prompt": p} for p in prompts]


def _money(x: float) -> str:
    return f"${x:.2f}" if x != int(x) else f"${int(x)}"


def _math_problems(r: random.Random) -> list[str]:
    def person() -> tuple[str, str]:
        return r.choice(PEOPLE)

    def change() -> str:
        name, pr = person()
        item = r.choice(["pencils", "apples", "notebooks", "bus tickets", "postcards", "bottles of juice"])
        n, price = r.randint(2, 6), r.choice([1.25, 1.5, 2.0, 2.75, 3.0, 3.5, 4.25])
        bill = next(b for b in (10, 20, 50) if b > n * price)
        return (f"{name} buys {n} {item} that cost {_money(price)} each and pays with a ${bill} bill. "
                f"How much change does {pr} get?")

    def share() -> str:
        name, _ = person()
        thing = r.choice(["sweets", "stickers", "cards", "marbles", "strawberries"])
        k = r.randint(3, 7)
        n = k * r.randint(4, 12) + r.randint(1, k - 1)
        return (f"{name} has {n} {thing} and shares them equally among {k} friends. How many does each "
                f"friend get, and how many are left over?")

    def distance() -> str:
        vehicle, v = r.choice([("car", (50, 60, 80, 90)), ("cyclist", (12, 15, 18, 20)),
                               ("bus", (40, 45, 50)), ("ship", (20, 25, 30))])
        speed, hours = r.choice(v), r.choice([2, 3, 4, 1.5, 2.5])
        h = f"{hours:g} hours" if hours != 1 else "1 hour"
        return f"A {vehicle} travels at {speed} kilometres per hour for {h}. How far does it travel?"

    def discount() -> str:
        item = r.choice(["jacket", "pair of shoes", "backpack", "lamp", "board game", "bicycle helmet"])
        price, pct = r.choice([20, 40, 60, 80, 120, 200]), r.choice([10, 20, 25, 50])
        return (f"A {item} costs ${price}. In a sale, the price is reduced by {pct}%. What is the new price, "
                f"and how much money is saved?")

    def ages() -> str:
        name, pr = person()
        a, k, d = r.randint(6, 12), r.choice([3, 4]), r.randint(2, 10)
        return (f"{name} is {a} years old, and {'her' if pr == 'she' else 'his'} mother is {k} times as old. "
                f"How old will the mother be when {name} is {a + d}?")

    def floor() -> str:
        room = r.choice(["kitchen", "classroom", "bedroom", "hallway", "garage"])
        length, width = r.randint(3, 12), r.randint(2, 8)
        return (f"A {room} floor is {length} metres long and {width} metres wide. Tiles cost $9 per square "
                f"metre. What is the area of the floor, and how much will the tiles cost?")

    def clock() -> str:
        transport = r.choice(["bus", "train", "ferry", "coach"])
        h, m, d = r.randint(7, 10), r.choice([5, 15, 20, 35, 40, 50]), r.choice([45, 55, 70, 85, 95, 125])
        return f"A {transport} leaves at {h}:{m:02d} am and the trip takes {d} minutes. At what time does it arrive?"

    def savings() -> str:
        name, pr = person()
        job = r.choice(["walking dogs", "washing cars", "babysitting", "delivering newspapers"])
        s = r.choice([8, 12, 20, 25])
        target = s * r.randint(5, 14)
        obj = "her" if pr == "she" else "him"
        return f"{name} earns ${s} each week by {job}. How many weeks will it take {obj} to earn ${target}?"

    def recipe() -> str:
        dish, food = r.choice([("pancakes", "flour"), ("a vegetable soup", "carrots"), ("a banana cake", "sugar"),
                               ("biscuits", "butter"), ("a fruit salad", "strawberries")])
        n, m = r.choice([(4, 6), (4, 10), (2, 5), (6, 9), (3, 12)])
        per = r.choice([30, 40, 50, 60])
        return (f"A recipe for {dish} for {n} people uses {per * n} grams of {food}. How many grams of {food} "
                f"are needed to make it for {m} people?")

    def pencils() -> str:
        c = r.choice([3, 4, 5, 6])
        b, p = r.randint(2, 9) * c, r.choice([10, 12, 24])
        return (f"A school orders {b} boxes of pencils. Each box holds {p} pencils. The pencils are shared "
                f"equally among {c} classes. How many pencils does each class get?")

    def fraction() -> str:
        name, pr = person()
        d = r.choice([2, 3, 4, 5])
        n, k = d * r.randint(4, 12), r.randint(3, 15)
        return (f"{name} had {n} stickers. {pr.capitalize()} gave away 1/{d} of them and then bought {k} more. "
                f"How many stickers does {pr} have now?")

    def average() -> str:
        name, _ = person()
        a, b = r.randint(10, 30), r.randint(10, 30)
        c = r.randint(10, 30)
        c += (3 - (a + b + c) % 3) % 3
        return f"{name} scored {a}, {b}, and {c} points in three basketball games. What was the average score?"

    def ribbon() -> str:
        piece = r.choice([20, 25, 40, 50])
        metres = r.randint(2, 9)
        return (f"A ribbon is {metres} metres long. It is cut into pieces that are each {piece} centimetres long. "
                f"How many pieces are there?")

    makers = [change, share, distance, discount, ages, floor, clock, savings, recipe, pencils, fraction, average,
              ribbon]
    out: list[str] = []
    for maker in makers:
        seen: set[str] = set()
        while len(seen) < 9:
            seen.add(maker())
        out += sorted(seen)
    return out


def _math(r: random.Random) -> list[dict]:
    problems = _math_problems(r)
    out = [{"prompt": f"{p} {MATH_SUFFIXES[i % len(MATH_SUFFIXES)]}"} for i, p in enumerate(problems)]
    r.shuffle(out)
    return out


def _code(r: random.Random) -> list[dict]:
    prompts = []
    for i, (sig, desc) in enumerate(CODE_FUNCTIONS):
        prompts.append(f"Write a Python function `{sig}` that {desc}.{CODE_FUNCTION_SUFFIXES[i % 4]}")
    prompts += [f"Write a short Python program that {task}." for task in CODE_PROGRAMS]
    explain_forms = ["Explain what this Python code does and what it prints:", "What does this Python code output? "
                     "Explain each line."]
    for i, snippet in enumerate(CODE_EXPLAIN):
        prompts.append(f"{explain_forms[i % 2]}\n\n```python\n{snippet}\n```")
    for snippet, symptom in CODE_BUGS:
        prompts.append(f"This Python code has a bug. {symptom} Explain the problem and show the corrected "
                       f"code.\n\n```python\n{snippet}\n```")
    prompts += [f"In Python, what is the difference between {a} and {b}? Give a short example of each."
                for a, b in CODE_DIFFERENCES]
    r.shuffle(prompts)
    return [{"prompt": p} for p in prompts]


def _article(r: random.Random, town: str, project: tuple) -> str:
    what, where, purpose, concern, response, caretaker, cost = project
    councillor = r.choice(COUNCILLORS)
    start, end = r.sample(MONTHS, 2)
    f1, f2 = r.sample(FUNDERS, 2)
    pct = r.choice([55, 60, 65, 70, 75, 80])
    planning = r.choice(["six", "nine", "twelve", "eighteen"])
    return (
        f"{town} approves plans for {what}\n\n"
        f"Residents of {town} will soon be able to use {what} {where}. The town council approved the plans in "
        f"{start} after {planning} months of planning and public meetings, and the work is expected to be "
        f"finished by {end} next year.\n\n"
        f"The project will cost {cost}. About {pct} percent of the money comes from {f1}, and the rest from "
        f"{f2}. Councillor {councillor}, who led the project, said the aim is to {purpose}. At the final "
        f"meeting, {councillor.split()[0]} told residents: \"{r.choice(QUOTES)}\"\n\n"
        f"Not everyone was in favour at first. During the public consultation, {concern}. In response, the "
        f"council agreed to {response}. A second round of meetings showed much stronger support for the plans.\n\n"
        f"Once it is finished, the {what.split(' ', 1)[1]} will be looked after by {caretaker}. Volunteers are "
        f"welcome to help, and an information evening will be held at the town hall on the first "
        f"{r.choice(DAYS)} of {end}. {r.choice(CLOSINGS)}"
    )


def _meeting(r: random.Random, team: str, people: list[str]) -> str:
    names = [p.split(" (")[0] for p in people]
    day, month, date = r.choice(DAYS), r.choice(MONTHS), r.randint(2, 14)
    items, actions = [], []
    a, b, c, d = r.sample(names, 4)
    pct, purchase = r.choice([55, 62, 70, 78, 84]), r.choice(PURCHASES)
    items.append(("Budget", f"{a} reported that {pct} percent of this year's budget has been spent. The group "
                            f"agreed to postpone buying {purchase} until the next quarter."))
    actions.append(f"{a}: update the budget sheet and share it before the next meeting")
    project, reason, decision = r.choice(DELAY_REASONS)
    items.append(("Progress", f"{b} explained that {project} is about {r.choice([5, 8, 10, 14])} days behind "
                              f"schedule because {reason}. After some discussion, the group decided to "
                              f"{decision}."))
    actions.append(f"{b}: agree a new date for {project}")
    extra = r.sample(["hiring", "feedback", "training", "event", "proposal"], 2)
    for kind in extra:
        if kind == "hiring":
            role = r.choice(ROLES)
            items.append(("Hiring", f"{c} said that interviews for the new {role} will take place next week. "
                                    f"{r.choice(['Three', 'Four', 'Five'])} candidates have been invited, and "
                                    f"{d} will join the interview panel."))
            actions.append(f"{c}: send interview invitations")
        elif kind == "feedback":
            items.append(("Feedback", f"{c} shared the results of the latest survey. The most common request "
                                      f"was {r.choice(FEATURES)}. The group agreed to look into it and report "
                                      f"back next time."))
            actions.append(f"{c}: prepare a short proposal based on the survey")
        elif kind == "training":
            items.append(("Training", f"{d} will organise a session on {r.choice(TRAINING_TOPICS)} on "
                                      f"{r.choice(DAYS)} afternoon. It is optional but recommended for new "
                                      f"members."))
            actions.append(f"{d}: book a trainer and a room")
        elif kind == "event":
            items.append(("Event", f"The group will host {r.choice(TEAM_EVENTS)} at the end of {month}. {c} "
                                   f"will book the venue and {d} will order food for about "
                                   f"{r.choice([30, 40, 60, 80])} people."))
            actions.append(f"{c} and {d}: venue and catering")
        else:
            change, worry = r.choice(PROPOSALS)
            items.append(("Proposal", f"{d} proposed {change}. Most people supported the idea, but {c} raised a "
                                      f"concern about {worry}. The group agreed to try it for one month."))
            actions.append(f"{d}: set up the trial and collect comments")
    lines = [f"{team} meeting notes", f"Date: {day}, {date} {month}", f"Present: {', '.join(people)}", ""]
    lines += [f"{i}. {title}. {text}" for i, (title, text) in enumerate(items, 1)]
    lines += ["", "Action items:"] + [f"- {x}" for x in actions]
    lines += ["", f"Next meeting: {day}, {date + 14} {month}."]
    return "\n".join(lines)


def _tool_doc(tool: tuple) -> str:
    name, kind, purpose, cmd, cmd_note, opt, opt_note, default, output, problem = tool
    return (
        f"{name}: user guide\n\n"
        f"{name} is a small {kind} that {purpose}. It is free, works on Windows, macOS, and Linux, and does not "
        f"need an account or an internet connection.\n\n"
        f"Installation. Install it with pip install {name}. To check that the installation worked, run "
        f"{name} --version, which prints the version number.\n\n"
        f"Basic use. The most common command is {cmd}. {cmd_note}\n\n"
        f"Options. The {opt} option {opt_note}. If you do not use it, {default}. Run {name} --help to see "
        f"every option with a short description.\n\n"
        f"Output. {output}.\n\n"
        f"Known problems. {problem}. If you find a new problem, please report it on the project's issue "
        f"page with the exact command you ran and the message you saw."
    )


def _announcement(item: tuple) -> str:
    sender, audience, subject, changes, contact = item
    labels = ("First,", "Second,", "Third,")
    body = "\n\n".join(f"{label} {text[0].lower()}{text[1:]}" for label, text in zip(labels, changes))
    return (
        f"{subject}\n\nDear {audience},\n\n"
        f"We are writing to let you know about some changes at {sender}. They are based on feedback we "
        f"received over the past year, and we hope they will make things easier for everyone.\n\n{body}\n\n"
        f"We know that changes can take some getting used to, and we are grateful for your patience. If you "
        f"have any questions or concerns, please speak to {contact}. We will review how the changes are working "
        f"after three months and let you know if anything needs to be adjusted.\n\n"
        f"Kind regards,\n{sender}"
    )


def _study(item: tuple) -> str:
    title, who, size, length, method, finding, detail, surprise, limitation, next_step = item
    return (
        f"{title}: summary of a study\n\n"
        f"Researchers wanted to find out whether small, everyday changes can make a measurable difference. In "
        f"this study, {size} {who} took part over {length}. To test the idea, {method}.\n\n"
        f"Results. The main finding was that {finding}. In addition, {detail}. The researchers were also "
        f"interested to see that {surprise}.\n\n"
        f"The team points out that the change was cheap and easy to introduce, which makes it attractive for "
        f"other organisations. However, they also describe a limitation of the study: {limitation}. For this "
        f"reason, they describe their results as promising rather than final.\n\n"
        f"Next steps. The researchers now plan to {next_step}. They have published their questionnaires and "
        f"data so that other teams can check the results or repeat the study in a different setting."
    )


def _story(item: tuple) -> str:
    name, pr, setting, goal, problem, attempt, helper, resolution, ending = item
    poss = "her" if pr == "she" else "his"
    return (
        f"In {setting}, there lived a young person named {name}. More than anything, {name} wanted to {goal}. "
        f"{pr.capitalize()} talked about it at breakfast, thought about it on the way home, and made plans in "
        f"a small notebook that {pr} carried everywhere.\n\n"
        f"But things did not go as planned: {problem}. {name} felt that all {poss} hard work might be "
        f"wasted. Still, {pr} did not give up: {attempt}.\n\n"
        f"Just when {name} was about to lose hope, help came from an unexpected place. {helper[0].upper()}"
        f"{helper[1:]} heard about the problem and {resolution}. {name} could hardly believe it and thanked "
        f"them again and again.\n\n{ending} Years later, {name} still says that the most important thing "
        f"{pr} learned that season was that asking for help is not a sign of weakness."
    )


def _summarization(r: random.Random) -> list[dict]:
    passages: list[tuple[str, str]] = []
    towns = TOWNS[:]
    r.shuffle(towns)
    for i, project in enumerate(PROJECTS):
        passages.append(("article", _article(r, towns[i % len(towns)], project)))
    for team, people in TEAMS + TEAMS:  # two different meetings per team
        passages.append(("meeting", _meeting(r, team, people)))
    passages += [("doc", _tool_doc(t)) for t in TOOLS]
    passages += [("announcement", _announcement(a)) for a in ANNOUNCEMENTS]
    passages += [("study", _study(s)) for s in STUDIES]
    passages += [("story", _story(s)) for s in STORIES]
    special = {
        "meeting": "List the decisions and the action items from these meeting notes, with the person "
                   "responsible for each.",
        "story": "Summarize this story in a few sentences, including how it ends.",
        "doc": "Summarize this guide in four bullet points for a new user.",
    }
    out = []
    for i, (kind, text) in enumerate(passages):
        if kind in special and i % 2 == 0:
            out.append({"prompt": f"{text}\n\n{special[kind]}"})
        elif i % 5 == 4:
            out.append({"prompt": f"{SUMMARY_LEADS[i % len(SUMMARY_LEADS)]}\n\n{text}"})
        else:
            out.append({"prompt": f"{text}\n\n{SUMMARY_INSTRUCTIONS[i % len(SUMMARY_INSTRUCTIONS)]}"})
    r.shuffle(out)
    return out


def _rag_gym(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    open_wd, open_we = r.choice([6, 7]), r.choice([8, 9])
    monthly, notice = r.choice([29, 35, 39, 45]), r.choice([14, 30])
    ahead, discount = r.choice([3, 5, 7]), r.choice([15, 20, 25])
    docs = [
        (f"{name}: opening hours",
         f"{name} is open from {open_wd}:00 to 22:00 on weekdays and from {open_we}:00 to 20:00 on Saturdays and "
         f"Sundays. On public holidays, the gym opens from 10:00 to 16:00. The sauna closes thirty minutes "
         f"before the gym."),
        (f"{name}: membership",
         f"A monthly membership costs {monthly} euros, and students receive a {discount} percent discount. There "
         f"is no joining fee. Memberships can be cancelled at any time with {notice} days' notice, in writing "
         f"or through the app."),
        (f"{name}: classes",
         f"Members can join yoga, spinning, and circuit classes at no extra cost. Classes can be booked in the "
         f"app up to {ahead} days in advance. Members who miss a booked class without cancelling cannot book "
         f"classes for the following week."),
        (f"{name}: house rules",
         f"Please bring a towel and wipe down equipment after use. Members aged 14 and 15 may train only when "
         f"accompanied by an adult member. Lockers must be emptied every evening, and items left overnight are "
         f"removed."),
    ]
    questions = [
        "Can a 15-year-old train at the gym alone?",
        "How much notice do I need to give to cancel my membership, and is there a joining fee?",
        "How far ahead can I book a class, and what happens if I miss a class without cancelling?",
        "What time does the gym open on Saturdays and on public holidays?",
    ]
    return docs, questions[q % len(questions)]


def _rag_hotel(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    checkin, checkout = r.choice([14, 15, 16]), r.choice([10, 11])
    breakfast, parking, pet = r.choice([12, 15, 18]), r.choice([8, 10, 15]), r.choice([10, 15, 20])
    docs = [
        (f"{name}: arrival and departure",
         f"Check-in is from {checkin}:00, and rooms must be vacated by {checkout}:00 on the day of departure. "
         f"Guests arriving after 22:00 should tell the hotel in advance so that a key can be left in the "
         f"night safe. Luggage can be stored at reception free of charge."),
        (f"{name}: breakfast",
         f"Breakfast is served in the garden room from 7:00 to 10:30. It costs {breakfast} euros per adult if "
         f"not included in the booking, and children under six eat free. Gluten-free bread is available on "
         f"request."),
        (f"{name}: parking",
         f"The hotel has a small car park with 20 spaces. Parking costs {parking} euros per night and cannot be "
         f"reserved. When the car park is full, guests can use the public garage 300 metres away."),
        (f"{name}: pets",
         f"Dogs are welcome in selected rooms for {pet} euros per night. Please mention your dog when booking. "
         f"Dogs are not allowed in the breakfast room or the spa area."),
    ]
    questions = [
        "My train arrives at 23:00. Can I still check in, and what should I do?",
        "How much would breakfast cost for two adults and a four-year-old child?",
        "Can I reserve a parking space, and what happens if the car park is full?",
        "Can I bring my dog, and where is the dog not allowed?",
    ]
    return docs, questions[q % len(questions)]


def _rag_package(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    py, timeout, retries = r.choice(["3.8", "3.9", "3.10"]), r.choice([5, 10, 30]), r.choice([2, 3, 5])
    env = name.upper().replace("-", "_")
    docs = [
        (f"{name} documentation: installation",
         f"Install the package with pip install {name}. It supports Python {py} and newer and has no required "
         f"dependencies. Optional extras can be installed with pip install {name}[all]."),
        (f"{name} documentation: configuration",
         f"Settings can be passed as keyword arguments or read from environment variables that start with "
         f"{env}_. Keyword arguments always take priority over environment variables. The default timeout is "
         f"{timeout} seconds."),
        (f"{name} documentation: errors",
         f"When an operation takes longer than the timeout, a TimeoutError is raised. Network errors are "
         f"retried up to {retries} times with a short pause between attempts before the error is passed on to "
         f"your code."),
        (f"{name} documentation: changelog",
         f"Version 2.0 removed support for older Python versions and renamed the function run_all() to "
         f"run_many(). The old name still works but prints a warning and will be removed in version 3.0."),
    ]
    questions = [
        f"I set {env}_TIMEOUT=60 but also pass timeout=15 in my code. Which value is used?",
        "What happens when a network error occurs, and how many times is it retried?",
        "My old code calls run_all(). Will it still work after upgrading to version 2.0?",
        "Which Python versions are supported, and does the package need any other libraries?",
    ]
    return docs, questions[q % len(questions)]


def _rag_rail(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    bike, bags, refund, kids = r.choice([3, 5, 0]), r.choice([2, 3]), r.choice([24, 48]), r.choice([5, 6])
    bike_text = "Bicycles travel free of charge" if bike == 0 else f"A bicycle ticket costs {bike} euros"
    docs = [
        (f"{name}: tickets",
         f"Tickets can be bought online, in the app, or at machines in every station. Children under {kids} "
         f"travel free, and children up to 14 pay half price. Tickets bought on board cost 3 euros extra."),
        (f"{name}: luggage",
         f"Each passenger may bring up to {bags} large bags and one small bag. Luggage must be stored in the "
         f"racks or under the seat and may not block the doors or the aisle."),
        (f"{name}: bicycles",
         f"{bike_text}. Bicycles can be taken on board outside the rush hours of 7:00 to 9:00 and 16:00 to "
         f"18:30 on weekdays. Folding bicycles that are folded count as luggage and can travel at any time."),
        (f"{name}: refunds",
         f"Unused tickets can be refunded up to {refund} hours before departure, minus a fee of 2 euros. If a "
         f"journey is delayed by more than one hour, passengers can claim back half of the ticket price."),
    ]
    questions = [
        "Can I take my normal bicycle on the 8:00 train on a Tuesday, and what does it cost?",
        "My train was 90 minutes late. Can I get any money back?",
        "How many bags can I bring, and where do they have to go?",
        "How much does my 4-year-old pay, and is it more expensive to buy a ticket on board?",
    ]
    return docs, questions[q % len(questions)]


def _rag_course(r: random.Random, course: tuple[str, str], q: int) -> tuple[list[tuple[str, str]], str]:
    title, venue = course
    weeks, fee, day = r.choice([6, 8, 10]), r.choice([90, 120, 150, 180]), r.choice(DAYS)
    attend = r.choice([75, 80])
    docs = [
        (f"{title} at {venue}: overview",
         f"The course runs for {weeks} weeks, every {day} evening from 18:30 to 20:30. It is designed for "
         f"complete beginners, and no previous experience is needed. Groups have a maximum of 12 "
         f"participants."),
        (f"{title} at {venue}: fees",
         f"The course fee is {fee} euros, including all materials. People who receive unemployment benefits "
         f"pay half. The full fee must be paid when booking; places are not held without payment."),
        (f"{title} at {venue}: cancellations",
         f"Participants who cancel at least 14 days before the first session receive a full refund. After "
         f"that, no refunds are given, but the place can be passed on to another person."),
        (f"{title} at {venue}: certificate",
         f"A certificate of attendance is given to participants who attend at least {attend} percent of the "
         f"sessions. Missed sessions cannot be made up in other groups."),
    ]
    questions = [
        "How long is the course, on which day does it take place, and how many people are in a group?",
        "I can no longer attend, and the course starts in 10 days. Can I get my money back?",
        "What do I need to do to receive a certificate?",
        "How much does the course cost for someone who receives unemployment benefits, and when must it be paid?",
    ]
    return docs, questions[q % len(questions)]


def _rag_appliance(r: random.Random, item: tuple[str, str, str], q: int) -> tuple[list[tuple[str, str]], str]:
    model, kind, part = item
    warranty, blink = r.choice([2, 3]), r.choice(["orange", "red"])
    docs = [
        (f"{model} manual: first use",
         f"Before using the {kind} for the first time, remove all packaging and wipe the outside with a dry "
         f"cloth. Place it on a flat, stable surface at least 10 centimetres from the wall. Do not use it "
         f"outdoors."),
        (f"{model} manual: cleaning",
         f"Unplug the {kind} before cleaning it. Removable parts, such as the {part}, can be washed in warm "
         f"soapy water and must be completely dry before they are refitted. Never put the main unit in water "
         f"or in a dishwasher."),
        (f"{model} manual: troubleshooting",
         f"If the light blinks {blink}, the {part} needs attention: remove it, clean it, and "
         f"refit it firmly. If the {kind} does not switch on at all, check that the plug is fully inserted and "
         f"try another socket."),
        (f"{model} manual: warranty",
         f"The {model} comes with a {warranty}-year warranty from the date of purchase. The warranty does not "
         f"cover damage caused by dropping the {kind} or by ignoring the cleaning instructions. Keep your "
         f"receipt as proof of purchase."),
    ]
    questions = [
        f"The light on my {model} is blinking {blink}. What should I do?",
        f"Can I wash the main unit of the {model} in the dishwasher?",
        f"I dropped my {model} and it broke. Is that covered by the warranty, and how long does the warranty last?",
        f"Where should I place the {model} before using it for the first time?",
    ]
    return docs, questions[q % len(questions)]


def _rag_festival(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    month = r.choice(["June", "July", "August", "September"])
    price, child = r.choice([25, 35, 45]), r.choice([12, 14])
    docs = [
        (f"{name}: dates and times",
         f"The festival takes place on the second weekend of {month}. Gates open at 11:00 on Saturday and "
         f"Sunday, and the last performance ends at 22:30. Re-entry is allowed with a wristband."),
        (f"{name}: tickets",
         f"A day ticket costs {price} euros and a weekend ticket costs {price * 2 - 10} euros. Children under "
         f"{child} enter free with a paying adult. Tickets bought at the gate cost 5 euros more than online "
         f"tickets."),
        (f"{name}: what to bring",
         f"Visitors may bring food, empty water bottles, folding chairs, and blankets. Glass, barbecues, and "
         f"drones are not allowed. Free water refill points are located next to every toilet block."),
        (f"{name}: getting there",
         f"Extra buses run from the central station every 20 minutes on festival days. There is no public "
         f"parking at the site, but bicycles can be left in a free, supervised bike park near the main gate."),
    ]
    questions = [
        "Can I bring my own food and a folding chair? Is anything not allowed?",
        "How much would a weekend ticket cost for two adults and a 10-year-old child if bought online?",
        "Can I drive to the festival and park there? What are the alternatives?",
        "If I leave the festival in the afternoon, can I come back in the evening?",
    ]
    return docs, questions[q % len(questions)]


def _rag_coworking(r: random.Random, name: str, q: int) -> tuple[list[tuple[str, str]], str]:
    day_pass, room, guests = r.choice([15, 20, 25]), r.choice([10, 12, 18]), r.choice([2, 3])
    docs = [
        (f"{name}: access",
         f"Members with a full membership can enter at any time with their key card. Day-pass holders can use "
         f"the space from 8:00 to 19:00. A day pass costs {day_pass} euros and includes coffee and tea."),
        (f"{name}: meeting rooms",
         f"Meeting rooms can be booked through the member website for {room} euros per hour. Full members get "
         f"four free hours per month. Bookings cancelled less than 24 hours in advance are charged in full."),
        (f"{name}: guests",
         f"Members may bring up to {guests} guests per day free of charge. Guests must sign in at the front "
         f"desk and leave by 19:00. Members are responsible for their guests' behaviour."),
        (f"{name}: kitchen and quiet areas",
         f"The shared kitchen has a fridge, microwave, and dishwasher; please label your food and clear the "
         f"fridge every Friday. Phone calls are not allowed in the quiet zone on the first floor."),
    ]
    questions = [
        f"I want to bring {guests + 1} clients to {name} tomorrow. Is that allowed, and until what time can "
        f"they stay?",
        "How much does a meeting room cost, and what happens if I cancel a booking on the same day?",
        "Can I work there at 21:00 with a day pass?",
        "Where am I not allowed to make phone calls, and what should I do with food I keep in the fridge?",
    ]
    return docs, questions[q % len(questions)]


def _rag(r: random.Random) -> list[dict]:
    domains = [
        (_rag_gym, GYMS), (_rag_hotel, HOTELS), (_rag_package, PACKAGES), (_rag_rail, RAIL_COMPANIES),
        (_rag_course, COURSES), (_rag_appliance, APPLIANCES), (_rag_festival, FESTIVALS),
        (_rag_coworking, COWORKING),
    ]
    out = []
    for builder, entities in domains:
        for i, entity in enumerate(entities):
            docs, question = builder(r, entity, i)
            r.shuffle(docs)
            body = "\n\n".join(f"[{k}] {title}\n{text}" for k, (title, text) in enumerate(docs, 1))
            header = RAG_HEADERS[i % len(RAG_HEADERS)]
            instruction = RAG_INSTRUCTIONS[(i // 2) % len(RAG_INSTRUCTIONS)]
            if i % 4 == 3:
                prompt = f"Question: {question}\n\n{header}\n\n{body}\n\n{instruction}"
            else:
                prompt = f"{header}\n\n{body}\n\nQuestion: {question}\n\n{instruction}"
            out.append({"prompt": prompt})
    r.shuffle(out)
    return out


BUILDERS = {
    "conversation": _conversation, "translation": _translation, "summarization": _summarization, "qa": _qa,
    "math": _math, "rag": _rag, "code": _code,
}


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


# Hand-written prompts are held to a stricter rule than the templated ones: no more than this share of content
# words in common (Jaccard) with any bench prompt or turn, so a natural question never paraphrases a bench one.
WRITTEN_OVERLAP = 0.4
STOPWORDS = frozenset(
    "a an the is are was were be to of in on at for and or but what why how does do did can could would should i "
    "my me you your it its this that these those with from by as about between difference which who when where "
    "there their they them we our if then than so not no into out up down over".split())


def content_words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-zà-ÿ0-9]+", text.lower())) - STOPWORDS


def closest_bench(text: str, bench: list[frozenset[str]]) -> float:
    """The largest content-word Jaccard overlap of `text` with any bench prompt or turn."""
    words = content_words(text)
    return max((len(words & other) / max(1, len(words | other)) for other in bench), default=0.0)


def written(category: str) -> list[dict]:
    """The hand-written prompts of one category (`prompt`, and `turns` for chats), in file order."""
    path = WRITTEN / f"{category}.jsonl"
    if not path.is_file():
        return []
    items = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("category", category) != category:
            raise ValueError(f"{path}: a {row['category']} prompt in the {category} file")
        items.append({k: row[k] for k in ("prompt", "turns") if k in row})
    return items


def build() -> list[dict]:
    """Return the full corpus, in file order, with ids assigned; raises on duplicates or bench overlap."""
    records: list[dict] = []
    for offset, (category, builder) in enumerate(BUILDERS.items()):
        for item in builder(random.Random(SEED + offset)):
            records.append({"id": f"train-{len(records) + 1:04d}", "category": category, **item})
    bench = [content_words(t) for p in bench_prompts() for t in (p["prompt"], *p.get("turns", []))]
    for category in BUILDERS:
        for item in written(category):
            for text in (item["prompt"], *item.get("turns", [])):
                if closest_bench(text, bench) >= WRITTEN_OVERLAP:
                    raise ValueError(f"written {category} prompt too close to a bench prompt: {text[:60]!r}")
            records.append({"id": f"train-{len(records) + 1:04d}", "category": category, **item})
    seen: set[str] = set()
    for rec in records:
        key = _normalize(rec["prompt"])
        if key in seen:
            raise ValueError(f"duplicate training prompt: {rec['id']}")
        seen.add(key)
    overlap = seen & {_normalize(p["prompt"]) for p in bench_prompts()}
    if overlap:
        raise ValueError(f"{len(overlap)} training prompt(s) also appear in bench/prompts")
    return records


def render(records: list[dict]) -> str:
    return "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the generated one")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"output path (default: {OUTPUT})")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != text:
            print(f"{args.output} is stale; rerun: python tools/make_train_prompts.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    counts: dict[str, int] = {}
    for line in text.splitlines():
        cat = json.loads(line)["category"]
        counts[cat] = counts.get(cat, 0) + 1
    print(f"wrote {sum(counts.values())} prompts to {args.output}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
