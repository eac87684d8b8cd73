# board.tcl: the window of the seeded curriculum tasks (local_gym/curriculum.py), run by wish in the sandbox.
#
# Why a Tk script: the curriculum needs a window whose content (coloured squares, a text box) is placed by
# a seed, starts in well under a second on 2 cores, and records exactly what the agent hit. Tk (tk8.6) is
# on every desktop already; the script has no logic of its own: the gym decides the instance and the
# score, this only draws and records.
#
# Protocol (all files in ~/.board/, written by the gym, read here, or the other way round):
#   instance   written by the gym when an execution starts; one item per line, fractions of the screen:
#                rect  ID X Y W H COLOUR      a filled square/rectangle
#                entry ID X Y W H             a text box
#                keys  ID                     record key presses (only instances that ask for it: a text box's
#                                             typing would otherwise be recorded too)
#                step  ID X Y W H COLOUR KEY  one screen of a sequence (key-sequence): the first step's square is
#                                             drawn; a press of KEY replaces it with the next step's (after the
#                                             last: an empty screen); any other key, or any key after the last
#                                             step, turns the screen black for good (the episode is lost). Every
#                                             press is recorded. The gym still decides the score, from events.
#   ready      written here once the instance is on screen (the gym waits for it): "ok W H SW SH", the
#              window's size and the screen's (the gym refuses a board the window manager left small)
#   events     appended here, one line per event: "click ID" (the topmost item under a left click, or
#              "background"), "submit ID TEXT" (Enter in a text box), "key KEYSYM" (a key press, when asked)
# Until the instance arrives the window is blank and records nothing (warm spares wait like that).

set dir [file join $env(HOME) .board]
wm title . Board
. configure -background white
canvas .c -background white -highlightthickness 0 -borderwidth 0
place .c -x 0 -y 0 -relwidth 1 -relheight 1

proc record {line} {
    global dir
    set f [open [file join $dir events] a]
    puts $f $line
    close $f
}

proc on_click {x y} {
    set hit background
    foreach item [.c find overlapping $x $y $x $y] {
        set tags [.c gettags $item]
        if {[llength $tags]} { set hit [lindex $tags 0] }
    }
    record "click $hit"
}

proc add_rect {id x y w h colour} {
    set W [winfo width .]
    set H [winfo height .]
    .c create rectangle [expr {$x * $W}] [expr {$y * $H}] [expr {($x + $w) * $W}] [expr {($y + $h) * $H}] \
        -fill $colour -outline $colour -tags [list $id]
}

proc add_entry {id x y w h} {
    set e .e_$id
    entry $e -font {DejaVuSans 20} -relief solid -borderwidth 2 -background white -highlightthickness 2 \
        -insertofftime 0
    place $e -relx $x -rely $y -relwidth $w -relheight $h
    bind $e <Button-1> [list record "click $id"]
    bind $e <Return> [list apply {{id e} { record "submit $id [$e get]" }} $id $e]
}

set steps {}
set at 0

proc draw_step {} {
    global steps at
    .c delete all
    if {$at < [llength $steps]} { add_rect {*}[lrange [lindex $steps $at] 0 5] }
}

proc on_step_key {keysym} {
    global steps at
    record "key $keysym"
    if {$at < [llength $steps] && $keysym eq [lindex $steps $at 6]} {
        incr at
        draw_step
    } else {
        set at [expr {[llength $steps] + 1}]
        .c delete all
        add_rect lost 0 0 1 1 #000000
    }
}

proc show {path} {
    global steps
    set f [open $path r]
    set lines [split [read $f] "\n"]
    close $f
    foreach line $lines {
        if {[string trim $line] eq ""} continue
        set rest [lassign $line kind]
        switch -- $kind {
            rect { add_rect {*}$rest }
            entry { add_entry {*}$rest }
            keys { bind .c <KeyPress> {record "key %K"}; focus -force .c }
            step { lappend steps $rest }
        }
    }
    if {[llength $steps]} {
        draw_step
        bind .c <KeyPress> {on_step_key %K}
        focus -force .c
    }
    bind .c <Button-1> {on_click %x %y}
    update idletasks
    update
    global dir
    # written whole, then renamed: the gym reads it as soon as it exists (CI: it once read the file between its
    # creation and its line, '', and refused the start)
    set f [open [file join $dir ready.tmp] w]
    puts $f "ok [winfo width .] [winfo height .] [winfo screenwidth .] [winfo screenheight .]"
    close $f
    file rename -force [file join $dir ready.tmp] [file join $dir ready]
}

proc poll {} {
    global dir
    set path [file join $dir instance]
    if {[file exists $path] && [winfo ismapped .] && [winfo width .] > 1} {
        show $path
    } else {
        after 10 poll
    }
}

poll
