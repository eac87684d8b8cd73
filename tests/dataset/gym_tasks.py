"""Task lists in the shapes gyms emit, shared by the dataset tests."""

LEVELS = ("easy", "normal", "hard")


def numbered_tasks(n: int = 40) -> list[dict]:
    """n tasks numbered 001..n in the shapes gyms emit: flat with task_number, and meta{number}."""
    tasks = []
    for i in range(1, n + 1):
        tags = [LEVELS[i % 3], "gym"]
        if i % 2:
            tasks.append({"task_id": f"t{i:03d}", "task_number": f"{i:03d}", "name": f"task {i}",
                          "description": f"describe {i}", "instruction": f"do thing {i}", "tags": tags})
        else:
            tasks.append({"id": f"uuid-{i}", "meta": {"number": f"{i:03d}", "displayName": f"task {i}",
                                                      "description": f"describe {i}"}, "tags": tags})
    return tasks
